"""What every rank runs for the default-dtype matrix: context-parallel attention on float64
inputs while `torch.set_default_dtype` is float64 or float16, against single-process attnlab
computed under the usual float32 default, for every layout × strategy × a set of masks."""

from __future__ import annotations

import torch

import attnlab
import attnlab.distributed as cp
from distributed.harness import make_mask, rel, subgroups

DEFAULTS = {"float64": torch.float64, "float16": torch.float16}
MASKS = ("causal", "sliding", "document", "padding", "combo", "window_or_prefix")
LAYOUTS = ("contiguous", "zigzag", "striped")
STRATEGIES = ("ring", "allgather", "ulysses")
L, B, H, D = 29, 2, 4, 8


def dtype_cases() -> list[dict]:
    return [dict(P=2, default=dd, layout=lay, strategy=st, mask=mk,
                 id=f"default-{dd}-{lay}-{st}-{mk}")
            for dd in DEFAULTS for lay in LAYOUTS for st in STRATEGIES for mk in MASKS]


def run_case(c: dict, group) -> dict:
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=torch.float64) for _ in range(3))
    mask, is_causal = make_mask(c["mask"], L, B)
    kw = dict(mask=mask, is_causal=is_causal)
    ref = attnlab.attention(q, k, v, **kw)  # under the float32 default
    lay = c["layout"]
    before = torch.get_default_dtype()
    torch.set_default_dtype(DEFAULTS[c["default"]])
    try:
        local = [cp.shard(x, lay, group=group).requires_grad_() for x in (q, k, v)]
        o = cp.context_parallel_attention(*local, group=group, layout=lay,
                                          strategy=c["strategy"], **kw)
        grads = torch.autograd.grad(o.sum(), local)
    finally:
        torch.set_default_dtype(before)
    return {"out": rel(o, cp.shard(ref, lay, group=group), ref),
            "finite_grads": all(bool(torch.isfinite(x).all()) for x in grads),
            "dtype": str(o.dtype)}


def run_dtypes(rank: int, world: int) -> dict:
    from distributed.harness import run_each

    return run_each(dtype_cases(), run_case, subgroups(world), rank)
