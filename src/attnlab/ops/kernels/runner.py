"""The interval kernel as attnlab.attention's engine for interval-shaped calls.

A call is interval-shaped when every query row attends one key interval: a structured mask whose
`intervals` exist (causal, windows, documents, prefix-LM, padding, their `&`), or no mask at all;
no dense `attn_mask`, no dropout, a float32/float16/bfloat16 CPU input. Backend "interval" runs
such calls here (and "auto" picks it) when the kernel is available (`ops/backends.py`).
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
    d, m = p.dims, p.structured
    if m is None:  # every row sees every key
        return (torch.zeros(1, 1, d.L, dtype=torch.int32),
                torch.full((1, 1, d.L), d.S, dtype=torch.int32))
    return m.intervals(d.L, d.S)  # kept with the mask: a forward's serve its weights' call


def applies(p: Problem) -> bool:
    """The kernel runs this call: interval-shaped, and the kernel available (built on first use);
    answered once per Problem (the dispatcher asks more than once)."""
    from attnlab.ops.kernels import build  # not the package: it imports ops.weights, which us

    key = ("kernels.applies", None)
    if key not in p.memo:
        p.memo[key] = build.enabled() and intervals_of(p) is not None and build.get() is not None
    return p.memo[key]


def _call(p: Problem, Dv: int) -> gate.Call:
    """The kernel's Call of a validated Problem, batch dims flattened into B. Its intervals come
    from the mask, right by construction (int32, contiguous, inside [0, S), 0 and 0 for a row
    with no key): `gate.check` is for the kernels' public entry points."""
    d = p.dims
    B = math.prod(d.batch)
    lo, hi = (_rows(x, d.batch, B) for x in intervals_of(p))  # (B|1, Hm, L)
    return gate.Call((B,), d.H, d.Hkv, d.L, d.S, d.D, Dv, lo=lo, hi=hi, scale=p.scale,
                     softcap=float(p.softcap or 0.0), slopes=gate.slopes(p.alibi_slopes, B, d.H),
                     pos_off=0)


def _batched(x: torch.Tensor, d) -> torch.Tensor:
    """(..., heads, n, m) of the call (or (n, m)) as (B, heads, n, m): the batch dims broadcast
    to the call's and flattened (a view unless a broadcast batch must be copied)."""
    if d.ndim == 4 and x.shape[0] == d.batch[0]:
        return x  # already (B, h, n, m)
    if d.ndim > 2:
        x = x.expand(*d.batch, *x.shape[-3:])
    return x.reshape(math.prod(d.batch), -1, *x.shape[-2:])  # (..., h, n, m) -> (B, h, n, m)


def _shaped(x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """x.reshape(shape), or x itself when it has that shape already."""
    return x if x.shape == shape else x.reshape(shape)


def _rows(x: torch.Tensor, batch: tuple[int, ...], B: int) -> torch.Tensor:
    """(Bm, Hm, L) intervals, Bm aligned with the last batch dim, as (B|1, Hm, L)."""
    if x.shape[0] == 1:
        return x
    return x.expand(*batch, *x.shape[1:]).reshape(B, *x.shape[1:])  # (..., Hm, L) -> (B, Hm, L)


def forward(p: Problem, need_lse: bool = True, verify: bool = False):
    """(out (..., H, L, Dv) in the input dtype, lse (..., H, L) float32), differentiable.

    verify: the kernel checks the inputs as it reads them (every key, the query and value rows
    it reads) and the result is None when one holds NaN/Inf: the caller then cleans them
    (`ops/nonfinite.py`) and calls again. What no row reads needs no check."""
    from attnlab.ops.kernels import kernel

    d = p.dims
    q, k, v = (_batched(x, d) for x in (p.query, p.key, p.value))  # (B, H|Hkv, L|S, D|Dv)
    out, lse, finite = kernel.IntervalAttention.apply(q, k, v, _call(p, d.Dv), None, verify)
    if not finite:
        return None
    rows = (*d.batch, d.H, d.L) if d.ndim > 2 else (d.L,)
    return _shaped(out, (*rows, d.Dv)), _shaped(lse, rows)  # (B, H, L, ·) -> (..., H, L, ·)


def weights(p: Problem, lse: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """(..., H, R, S) float32: the rows idx (R,) of the weights exp(s - lse) from the kernel
    (`ops.weights.rows_of` on an interval-shaped call; p.value is not read)."""
    from attnlab.ops.kernels import kernel

    d = p.dims
    c = _call(p, 0)
    w = kernel._weights(c, _batched(p.query, d), _batched(p.key, d),
                        _shaped(lse, (c.B, d.H, d.L)), idx)  # (..., H, L) -> (B, H, L)
    return _shaped(w, (*d.scores_shape[:-2], idx.numel(), d.S))  # (B, H, R, S) -> (..., H, R, S)
