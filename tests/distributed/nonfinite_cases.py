"""What every rank runs for the non-finite matrix: one NaN, +inf or −inf in the query, key or
value (two entries: one in batch 0 that rows attend, one in batch 1 near the end, which a padded
call attends from nowhere), for every layout × strategy × mask, context-parallel against
single-process `attnlab.attention` on the whole tensors: out, lse, dq, dk, dv must hold NaN/±inf
in the same entries and agree elsewhere. Small sizes, every case on one spawned group."""

from __future__ import annotations

import torch

import attnlab
import attnlab.distributed as cp
from distributed.harness import make_mask, same_nonfinite, subgroups

LAYOUTS = ("contiguous", "zigzag", "striped")
STRATEGIES = ("ring", "allgather", "ulysses")
MASKS = ("none", "causal", "sliding", "document", "padding")
VALUES = {"nan": float("nan"), "+inf": float("inf"), "-inf": float("-inf")}
WHERE = ("q", "k", "v")
P, L, B, H, D = 2, 16, 2, 2, 8


def nonfinite_cases() -> list[dict]:
    """All 405: 3 layouts × 3 strategies × 5 masks × 3 values × 3 tensors, at P = 2."""
    return [dict(P=P, layout=lay, strategy=st, mask=mk, value=val, where=wh,
                 id=f"{lay}-{st}-{mk}-{val}-in-{wh}")
            for lay in LAYOUTS for st in STRATEGIES for mk in MASKS for val in VALUES
            for wh in WHERE]


def _inputs(c: dict):
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=torch.float64) for _ in range(3))
    w = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)  # d loss / d out
    u = torch.randn(B, H, L, generator=g, dtype=torch.float64)  # d loss / d lse
    x = {"q": q, "k": k, "v": v}[c["where"]]
    x[0, 0, 5, 1] = VALUES[c["value"]]  # attended by later rows (causal), by its window, ...
    x[1, 1, L - 2, 3] = VALUES[c["value"]]  # a key no row of batch 1 attends under padding
    return q, k, v, w, u


def run_case(c: dict, group) -> dict:
    q, k, v, w, u = _inputs(c)
    mask, is_causal = make_mask(c["mask"], L, B)
    kw = dict(mask=mask, is_causal=is_causal)
    whole = [x.clone().requires_grad_() for x in (q, k, v)]
    ro, rl = attnlab.attention(*whole, return_lse=True, **kw)
    ref = (ro, rl, *torch.autograd.grad([ro, rl], whole, [w, u]))
    lay = c["layout"]

    def sh(x, dim=-2):
        return cp.shard(x, lay, group=group, dim=dim)

    local = [sh(x).requires_grad_() for x in (q, k, v)]
    o, lse = cp.context_parallel_attention(*local, group=group, layout=lay,
                                           strategy=c["strategy"], return_lse=True, **kw)
    got = (o, lse, *torch.autograd.grad([o, lse], local, [sh(w), sh(u, -1)]))
    res = {}
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, ref):
        res[name] = same_nonfinite(a, sh(b, -1 if name == "lse" else -2))
    res["nan_rows"] = int(torch.isnan(o).any(-1).sum())
    return res


def run_nonfinite(rank: int, world: int) -> dict:
    """Every case on this rank (an error is returned per case, not raised)."""
    from distributed.harness import run_each

    return run_each(nonfinite_cases(), run_case, subgroups(world), rank)
