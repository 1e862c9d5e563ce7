"""What every rank runs for the Ulysses lse-gradient tests: losses that use the output, the lse,
both, or differ by rank (rank 0 the lse alone, the others the output alone), with the bytes and
messages each rank counted and the plan's, and the float64 errors against single-process autograd
on the whole tensors. Ranks return plain numbers; the tests assert on them."""

from __future__ import annotations

import torch

import attnlab
import attnlab.distributed as cp
from distributed.harness import make_mask, rel, run_each, subgroups

#: every group's timeout: a rank whose collectives do not line up fails in seconds
GROUP_TIMEOUT_S = 10.0
#: out: return_lse=False, a loss of the output; both: output and lse on every rank; mixed: rank 0
#: the lse alone, every other rank the output alone
LOSSES = ("out", "both", "mixed")


def ulysses_cases() -> list[dict]:
    cases = []
    for loss in LOSSES:  # the mixed losses last: a rank out of step fails the cases after it
        for P, layout, mk, L, H, Hkv, dtype in (
                (4, "zigzag", "causal", 37, 8, 4, "fp64"),
                (4, "contiguous", "padding", 29, 4, 4, "fp64"),  # rows that attend nothing
                (2, "striped", "document3", 21, 4, 2, "fp64"),
                (4, "zigzag", "causal", 37, 8, 4, "bf16")):  # out bf16, lse fp32: one message
            cases.append(dict(P=P, layout=layout, mask=mk, L=L, H=H, Hkv=Hkv, dtype=dtype,
                              loss=loss, id=f"{loss}-P{P}-{layout}-{mk}-H{H}kv{Hkv}-{dtype}",
                              seed=3000 + len(cases)))
    return sorted(cases, key=lambda c: c["loss"] == "mixed")


def run_case(c: dict, group, rank: int) -> dict:
    L, H, Hkv, D, B, P = c["L"], c["H"], c["Hkv"], 16, 2, c["P"]
    dtype = {"fp64": torch.float64, "bf16": torch.bfloat16}[c["dtype"]]
    g = torch.Generator().manual_seed(c["seed"])
    q, k, v = (torch.randn(B, h, L, D, generator=g, dtype=torch.float64).to(dtype)
               for h in (H, Hkv, Hkv))
    w = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)  # d loss / d out
    u = torch.randn(B, H, L, generator=g, dtype=torch.float64)  # d loss / d lse
    lay, loss = c["layout"], c["loss"]
    sh = lambda x, dim=-2: cp.shard(x, lay, group=group, dim=dim)  # noqa: E731
    if loss == "out":
        u = torch.zeros_like(u)
    elif loss == "mixed":  # rank 0's rows: the lse alone; every other row: the output alone
        on0 = torch.zeros(L, dtype=torch.bool)
        on0[cp.geometry.Geometry(L, L, P, lay, None).q.positions(0)] = True
        w = w.masked_fill(on0[:, None], 0.0)
        u = u.masked_fill(~on0, 0.0)
    mask, is_causal = make_mask(c["mask"], L)
    kw = dict(mask=mask, is_causal=is_causal, enable_gqa=Hkv != H)
    whole = [x.clone().requires_grad_() for x in (q, k, v)]
    ro, rl = attnlab.attention(*whole, return_lse=True, backend="math", **kw)
    rg = torch.autograd.grad([ro, rl], whole, [w.to(ro.dtype), u.to(rl.dtype)])
    local = [sh(x).requires_grad_() for x in (q, k, v)]
    with cp.record() as log:
        res = cp.context_parallel_attention(*local, group=group, layout=lay, strategy="ulysses",
                                            return_lse=loss != "out", **kw)
        o, lse = (res, None) if loss == "out" else res
        wl, ul = sh(w).to(o.dtype), None if lse is None else sh(u, -1).to(lse.dtype)
        if loss == "out":
            grads = torch.autograd.grad(o, local, wl)
        elif loss == "both":
            grads = torch.autograd.grad([o, lse], local, [wl, ul])
        elif rank == 0:
            grads = torch.autograd.grad(lse, local, ul)
        else:
            grads = torch.autograd.grad(o, local, wl)
    out = {"rows": o.shape[2]}
    pairs = [("out", o, ro), ("dq", grads[0], rg[0]), ("dk", grads[1], rg[1]),
             ("dv", grads[2], rg[2])]
    if lse is not None:
        pairs.append(("lse", lse, rl))
    for name, a, full in pairs:
        out[name] = rel(a, sh(full, -1 if full.dim() == 3 else -2), full)
    out["got"] = tuple(f(ph, what) for f in (log.total, log.messages)
                       for ph in ("forward", "backward") for what in ("sent", "received"))
    est = cp.plan(L, H, Hkv, D, P, mask=mask, is_causal=is_causal, layout=lay, dtype=dtype,
                  batch=B)["ulysses"]
    out["plan"] = (est.fwd_sent[rank], est.fwd_recv[rank], est.bwd_sent[rank],
                   est.bwd_recv[rank], est.fwd_msgs_sent[rank], est.fwd_msgs_recv[rank],
                   est.bwd_msgs_sent[rank], est.bwd_msgs_recv[rank])
    out["lse_bwd_bytes"] = B * H * est_n(L, P, lay) * (8 if dtype == torch.float64 else 4) \
        * (P - 1) // P
    return out


def est_n(L: int, P: int, layout: str) -> int:
    return cp.geometry.Geometry(L, L, P, layout, None).q.n_max


def run_ulysses(rank: int, world: int) -> dict:
    """Every case that includes this rank; an error is returned, not raised, per case."""
    groups = subgroups(world, GROUP_TIMEOUT_S, smallest=2)
    return run_each(ulysses_cases(), lambda c, g: run_case(c, g, rank), groups, rank)
