"""What every rank runs for the lse-gradient tests: context-parallel attention whose loss uses
both the output and the returned lse (a gradient on every row, rows with nothing to attend
included), compared in float64 with single-process autograd on the whole tensors. Ranks return
plain numbers; the tests assert on them."""

from __future__ import annotations

import torch

import attnlab
import attnlab.distributed as cp
from distributed.harness import make_mask, rel, run_each, subgroups


def lse_cases() -> list[dict]:
    cases = []
    for strategy in ("ulysses", "ring", "allgather"):
        for mk in ("causal", "sliding", "document3", "padding"):
            cases.append(dict(P=4, layout="zigzag", strategy=strategy, mask=mk, L=37, H=8,
                              Hkv=4, softcap=None))
        cases.append(dict(P=4, layout="zigzag", strategy=strategy, mask="causal", L=37, H=8,
                          Hkv=4, softcap=4.0))
        cases.append(dict(P=2, layout="striped", strategy=strategy, mask="padding", L=29, H=4,
                          Hkv=2, softcap=3.0))
        cases.append(dict(P=3, layout="contiguous", strategy=strategy, mask="document3", L=29,
                          H=6, Hkv=3 if strategy == "ulysses" else 1, softcap=None))
    cases.append(dict(P=1, layout="zigzag", strategy="ulysses", mask="padding", L=21, H=4,
                      Hkv=2, softcap=None))
    for i, c in enumerate(cases):
        c["id"] = (f"P{c['P']}-{c['layout']}-{c['strategy']}-{c['mask']}-H{c['H']}kv{c['Hkv']}"
                   + ("" if c["softcap"] is None else f"-softcap{c['softcap']:g}"))
        c["seed"] = 1000 + i
    return cases


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
        res[name] = rel(a, sh(full, -1 if full.dim() == 3 else -2), full)
    return res


def run_lse(rank: int, world: int) -> dict:
    """Every case that includes this rank; an error is returned, not raised, per case."""
    return run_each(lse_cases(), run_case, subgroups(world), rank)
