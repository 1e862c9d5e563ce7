"""What every rank runs for the lse-gradient tests: context-parallel attention whose loss uses
both the output and the returned lse (a gradient on every row, rows with nothing to attend
included), compared in float64 with single-process autograd on the whole tensors. Ranks return
plain numbers; the tests assert on them."""

from __future__ import annotations

import torch

import attnlab
import attnlab.distributed as cp
from attnlab import masks


def make_mask(kind: str, L: int):
    """(mask, is_causal) in global positions."""
    return {
        "causal": (None, True),
        "sliding": (masks.sliding_window(5), False),
        "document": (masks.document(torch.arange(L) * 3 // L), True),  # crosses shard borders
        "padding": (masks.padding(key_lengths=[L - 3, L // 2], query_lengths=[L, L - 7]),
                    False),  # batch 1's last 7 rows attend nothing
    }[kind]


def lse_cases() -> list[dict]:
    cases = []
    for strategy in ("ulysses", "ring", "allgather"):
        for mk in ("causal", "sliding", "document", "padding"):
            cases.append(dict(P=4, layout="zigzag", strategy=strategy, mask=mk, L=37, H=8,
                              Hkv=4, softcap=None))
        cases.append(dict(P=4, layout="zigzag", strategy=strategy, mask="causal", L=37, H=8,
                          Hkv=4, softcap=4.0))
        cases.append(dict(P=2, layout="striped", strategy=strategy, mask="padding", L=29, H=4,
                          Hkv=2, softcap=3.0))
        cases.append(dict(P=3, layout="contiguous", strategy=strategy, mask="document", L=29,
                          H=6, Hkv=3 if strategy == "ulysses" else 1, softcap=None))
    cases.append(dict(P=1, layout="zigzag", strategy="ulysses", mask="padding", L=21, H=4,
                      Hkv=2, softcap=None))
    for i, c in enumerate(cases):
        c["id"] = (f"P{c['P']}-{c['layout']}-{c['strategy']}-{c['mask']}-H{c['H']}kv{c['Hkv']}"
                   + ("" if c["softcap"] is None else f"-softcap{c['softcap']:g}"))
        c["seed"] = 1000 + i
    return cases


def _rel(a: torch.Tensor, b: torch.Tensor, full: torch.Tensor) -> float:
    """max |a − b| (equal infinities count as 0, NaN as inf) over the whole reference's largest
    finite entry."""
    a, b, full = a.detach(), b.detach(), full.detach()
    d = torch.where(torch.isinf(a) & (a == b), 0.0, (a - b).abs())
    d = torch.nan_to_num(d, nan=float("inf"))
    fin = full[torch.isfinite(full)].abs()
    scale = float(fin.max()) if fin.numel() else 1.0
    return float(d.max()) / max(scale, 1e-300) if d.numel() else 0.0


def run_case(c: dict, group) -> dict:
    L, H, Hkv, D, B = c["L"], c["H"], c["Hkv"], 16, 2
    g = torch.Generator().manual_seed(c["seed"])
    q, k, v = (torch.randn(B, h, L, D, generator=g, dtype=torch.float64) for h in (H, Hkv, Hkv))
    w = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)  # d loss / d out
    u = torch.randn(B, H, L, generator=g, dtype=torch.float64)  # d loss / d lse, every row
    mask, is_causal = make_mask(c["mask"], L)
    kw = dict(mask=mask, is_causal=is_causal, enable_gqa=Hkv != H, softcap=c["softcap"])
    whole = [x.clone().requires_grad_() for x in (q, k, v)]
    ro, rl = attnlab.attention(*whole, return_lse=True, backend="math", **kw)
    rg = torch.autograd.grad([ro, rl], whole, [w, u])
    lay = c["layout"]
    sh = lambda x, dim=-2: cp.shard(x, lay, group=group, dim=dim)  # noqa: E731
    local = [sh(x).requires_grad_() for x in (q, k, v)]
    calls = []
    from attnlab.ops import tiled

    real = tiled.backward
    tiled.backward = lambda *a, **k_: calls.append(1) or real(*a, **k_)  # a spy on block backward
    try:
        o, lse = cp.context_parallel_attention(*local, group=group, layout=lay,
                                               strategy=c["strategy"], return_lse=True, **kw)
        grads = torch.autograd.grad([o, lse], local, [sh(w), sh(u, -1)])
    finally:
        tiled.backward = real
    res = {"rows": o.shape[2], "tiled_blocks": len(calls)}
    for name, a, full in zip(("out", "lse", "dq", "dk", "dv"), (o, lse, *grads),
                             (ro, rl, *rg)):
        res[name] = _rel(a, sh(full, -1 if full.dim() == 3 else -2), full)
    return res


def run_lse(rank: int, world: int) -> dict:
    """Every case that includes this rank; an error is returned, not raised, per case."""
    import traceback

    from distributed.launch import subgroups

    groups = subgroups(world)
    out = {}
    for c in lse_cases():
        if rank < c["P"]:
            try:
                out[c["id"]] = run_case(c, groups[c["P"]])
            except Exception:  # reported by the test that reads this case
                out[c["id"]] = {"error": traceback.format_exc(limit=3)}
    return out
