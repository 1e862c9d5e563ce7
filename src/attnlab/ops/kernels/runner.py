"""The interval kernel as attnlab.attention's engine for interval-shaped calls.

A call is interval-shaped when every query row attends one key interval: a structured mask whose
`intervals` exist (causal, windows, documents, prefix-LM, padding, their `&`), or no mask at all;
no dense `attn_mask`, no dropout, a float32/float16/bfloat16 CPU input. Backends "auto" and
"tiled" run such calls here when the kernel is available (`dispatch.py`).
"""

from __future__ import annotations

import math

import torch

from attnlab.ops.kernels import gate
from attnlab.ops.problem import Problem


def intervals_of(p: Problem):
    """(lo, hi) int32 (Bm, Hm, L) of the call, or None when it is not interval-shaped; computed
    once per Problem (O(L))."""
    key = ("kernels.intervals", None)
    if key not in p.memo:
        p.memo[key] = _intervals(p)
    return p.memo[key]


def _intervals(p: Problem):
    if p.attn_mask is not None or p.dropout_p or p.query.dtype not in gate.DTYPES or \
            p.query.device.type != "cpu":
        return None
    d = p.dims
    if p.structured is None:  # every row sees every key
        return (torch.zeros(1, 1, d.L, dtype=torch.int32),
                torch.full((1, 1, d.L), d.S, dtype=torch.int32))
    return p.structured.intervals(d.L, d.S)


def applies(p: Problem) -> bool:
    """The kernel runs this call: interval-shaped, and the kernel available (built on first use)."""
    from attnlab.ops import kernels
    from attnlab.ops.kernels import build

    return build.enabled() and intervals_of(p) is not None and kernels.available()


def _flat(p: Problem):
    """q (B, H, L, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv), lo and hi (B|1, Hm, L): batch dims
    broadcast and flattened into B."""
    d = p.dims
    B = math.prod(d.batch)
    q = p.query.expand(*d.batch, d.H, d.L, d.D) if d.ndim > 2 else p.query
    k = p.key.expand(*d.batch, d.Hkv, d.S, d.D) if d.ndim > 2 else p.key
    v = p.value.expand(*d.batch, d.Hkv, d.S, d.Dv) if d.ndim > 2 else p.value
    q = q.reshape(B, d.H, d.L, d.D)  # (..., H, L, D) -> (B, H, L, D)
    k = k.reshape(B, d.Hkv, d.S, d.D)  # (..., Hkv, S, D) -> (B, Hkv, S, D)
    v = v.reshape(B, d.Hkv, d.S, d.Dv)  # (..., Hkv, S, Dv) -> (B, Hkv, S, Dv)
    lo, hi = (_rows(x, d.batch, B) for x in intervals_of(p))
    return q, k, v, lo, hi


def _rows(x: torch.Tensor, batch: tuple[int, ...], B: int) -> torch.Tensor:
    """(Bm, Hm, L) intervals, Bm aligned with the last batch dim, as (B|1, Hm, L)."""
    if x.shape[0] == 1:
        return x
    return x.expand(*batch, *x.shape[1:]).reshape(B, *x.shape[1:])  # (..., Hm, L) -> (B, Hm, L)


def forward(p: Problem, need_lse: bool = True):
    """(out (..., H, L, Dv) in the input dtype, lse (..., H, L) float32), differentiable."""
    from attnlab.ops import kernels

    d = p.dims
    q, k, v, lo, hi = _flat(p)
    out, lse = kernels.interval_attention(q, k, v, lo, hi, scale=p.scale, softcap=p.softcap,
                                          alibi=p.alibi_slopes)
    rows = (*d.batch, d.H, d.L) if d.ndim > 2 else (d.L,)
    return out.reshape(*rows, d.Dv), lse.reshape(rows)  # (B, H, L, ·) -> (..., H, L, ·)
