"""The interval kernel in three layers: the pure `_fwd` / `_bwd` / `_weights` on a checked Call,
the autograd Function, and the public functions (exported by `attnlab.ops.kernels`)."""

from __future__ import annotations

import dataclasses
import functools
import os

import torch

from attnlab.ops import second_order
from attnlab.ops.kernels import build, gate
from attnlab.ops.kernels.gate import Call


def _ops(isa: str | None):
    ops = build.get(isa)
    if ops is None:
        st = build.status()
        raise build.KernelUnavailable(f"the interval kernel is not available: {st.reason}")
    return ops


def _padded(ops, x: torch.Tensor) -> torch.Tensor:
    """x (B, h, n, m) as float32 rows padded with zeros to a multiple of PAD floats (the layout of
    `gate.rows_padded`, its oracle), made by the kernel's op on the kernel's threads."""
    x = gate.rows(x)
    width = gate.padded_width(x.shape[-1])
    return x if width == x.shape[-1] else ops.rows_padded(x, width)


#: ATTNLAB_KERNEL_BWD: "fused" (dQ added during the dK/dV pass, one item per key/value head),
#: "split" (a separate dQ pass over query panels); unset: the kernel picks by items per thread
BWD_MODES = {"": 0, "fused": 1, "split": 2}


def _bwd_mode() -> int:
    mode = os.environ.get("ATTNLAB_KERNEL_BWD", "").strip().lower()
    if mode not in BWD_MODES:
        raise build.KernelUnavailable("ATTNLAB_KERNEL_BWD: expected fused, split or unset, "
                                      f"got {mode!r}")
    return BWD_MODES[mode]


def _fwd(c: Call, q, k, v, isa=None, check=False):
    """(out (B, H, L, Dv) in q's dtype, lse float32 (B, H, L)), the prepared (q, kᵀ, v), and
    whether what the call read is finite: every key, and every query and value row a panel with
    work read (check=False: None, nothing checked; an empty call reads nothing: True). A NaN/Inf
    key stops the call before the forward (out and lse None)."""
    if c.empty:
        out = q.new_zeros(c.B, c.H, c.L, c.Dv)
        return out, q.new_full((c.B, c.H, c.L), float("-inf"), dtype=torch.float32), None, True
    ops = _ops(isa)
    qf, vp = gate.rows(q), _padded(ops, v)
    if check:  # the keys' check rides on their transpose, the rows' on the forward's reads
        kt, keys_finite = ops.keys_last_checked(gate.rows(k))
        if not keys_finite:
            return None, None, None, False
    else:
        kt = ops.keys_last(gate.rows(k))
    out, lse, rows_finite = ops.fwd(qf, kt, vp, c.lo, c.hi, c.slopes, c.scale, c.softcap,
                                    c.pos_off, c.Dv, check)
    return out.to(q.dtype), lse, (qf, kt, vp), rows_finite if check else None


def _bwd(c: Call, q, k, v, out, lse, dout, dlse=None, prepared=None, isa=None):
    """(dq, dk, dv) in q's, k's and v's dtypes; rows with lse -inf get zero gradient."""
    if c.empty:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    ops = _ops(isa)
    kf, vf = gate.rows(k), gate.rows(v)  # converted once (fp16/bf16 in: one copy each)
    qf, kt, vp = prepared or (gate.rows(q), ops.keys_last(kf), _padded(ops, vf))
    go = dout.to(torch.float32)  # (B, H, L, Dv), any strides (a sum's gradient: one value)
    delta = ops.row_dot(go, out.to(torch.float32))  # rowsum(dO ∘ O): (B, H, L, Dv) -> (B, H, L)
    if dlse is not None:
        delta = delta - dlse.to(torch.float32)
    lse = gate.dense(lse)
    vt = ops.keys_last(vf)
    dq, dk, dv = ops.bwd(qf, _padded(ops, kf), kt, vp, vt, c.lo, c.hi, c.slopes, lse,
                         delta.contiguous(), go, c.scale, c.softcap, c.pos_off, _bwd_mode())
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _weights(c: Call, q, k, lse, idx, isa=None):
    """(B, H, R, S) float32: rows idx (R,) int64 in [0, L) of the weights exp(s - lse), s the
    forward's scores. Inputs the kernel reads in place are not copied; others only in the
    requested rows and the keys they attend."""
    R = idx.numel()
    idx = idx if idx.is_contiguous() else idx.contiguous()
    if c.empty or R == 0:
        return torch.zeros(c.B, c.H, R, c.S)
    ops = _ops(isa)
    q_at = None  # q holds every row: row idx[r] is row r's query
    if not gate.in_place(q):
        q, q_at = gate.rows(q.index_select(2, idx)), torch.arange(R)  # (B, H, R, D)
    k0 = 0
    if not gate.in_place(k):  # (B, Hkv, k1 - k0, D): the keys the requested rows attend
        lo, hi = c.lo.index_select(-1, idx), c.hi.index_select(-1, idx)
        live = lo < hi
        k0, k1 = (int(lo[live].min()), int(hi[live].max())) if bool(live.any()) else (0, 0)
        k = gate.rows(k[:, :, k0:k1])
    return ops.weights(q, k, idx, q_at, gate.dense(lse), c.lo, c.hi, c.slopes, c.scale,
                       c.softcap, c.pos_off, k0, c.S)


class IntervalAttention(torch.autograd.Function):
    """(q, k, v, c, isa, check=False) -> (out, lse, finite).

    finite: a bool tensor () that autograd does not differentiate: with check=True, whether what
    the forward read was all finite; when it is False, out and lse are placeholders not to be
    used (the caller cleans the inputs and calls again). Always True without check.

    Everything the backward reads is saved with `save_for_backward` (q, k, v, out, lse, the
    prepared fp32 q, Kᵀ and padded v, the intervals and slopes), so saved-tensor hooks
    (offloading, checkpointing tools) see all of it; ctx keeps only sizes and scalars.
    """

    @staticmethod
    def forward(ctx, q, k, v, c: Call, isa, check: bool = False):
        out, lse, prepared, finite = _fwd(c, q, k, v, isa, check=check)
        ok = torch.tensor(finite is not False)
        if finite is False:  # nothing to keep: the call is made again on cleaned inputs
            out, lse = q.new_zeros(()), q.new_zeros(())
            ctx.mark_non_differentiable(out, lse, ok)
            return out, lse, ok
        ctx.mark_non_differentiable(ok)
        ctx.save_for_backward(q, k, v, out, lse, *(prepared or (None,) * 3), c.lo, c.hi,
                              c.slopes)
        ctx.c = dataclasses.replace(c, lo=None, hi=None, slopes=None)  # sizes, scalars
        ctx.isa = isa
        ctx.set_materialize_grads(False)
        return out, lse, ok

    @staticmethod
    def backward(ctx, dout, dlse, _):
        q, k, v, out, lse, qf, kt, vp, lo, hi, slopes = ctx.saved_tensors
        c = dataclasses.replace(ctx.c, lo=lo, hi=hi, slopes=slopes)
        if second_order.wanted():  # create_graph=True: gradients that are differentiable again
            return (*second_order_grads(c, q, k, v, dout, dlse), None, None, None)
        if dout is None:
            dout = torch.zeros_like(out)
        prepared = None if qf is None else (qf, kt, vp)
        dq, dk, dv = _bwd(c, q, k, v, out, lse, dout, dlse, prepared, ctx.isa)
        return dq, dk, dv, None, None, None


def second_order_grads(c: Call, q, k, v, dout, dlse, what: str = "the interval kernel"):
    """(dq, dk, dv) of a Call with a graph (`create_graph=True`): the call recomputed with
    differentiable PyTorch ops (`_math`), differentiated by autograd (`ops/second_order.py`)."""
    second_order.check(what, (c.B, c.H, c.L, c.S), 4)
    return second_order.grads(functools.partial(_math, c), (q, k, v), dout, dlse)


def _math(c: Call, q, k, v):
    """(out (B, H, L, Dv) in q's dtype, lse float32 (B, H, L)) of the Call with differentiable
    PyTorch ops in float32, the kernel's score order (scale, softcap, ALiBi, the row's interval):
    the recomputation a double backward differentiates."""
    from attnlab.ops import scores

    G = c.groups
    qf, kf, vf = (x.to(torch.float32) for x in (q, k, v))
    if G > 1:
        kf = kf.repeat_interleave(G, dim=1)  # (B, Hkv, S, D) -> (B, H, S, D)
        vf = vf.repeat_interleave(G, dim=1)  # (B, Hkv, S, Dv) -> (B, H, S, Dv)
    s = scores.product(qf, kf, c.scale)  # (B, H, L, D) @ (B, H, D, S) -> (B, H, L, S)
    rows = torch.arange(c.L, device=q.device)
    cols = torch.arange(c.S, device=q.device)
    allowed = (cols >= c.lo[..., None]) & (cols < c.hi[..., None])  # (B|1, H|1, L, S)
    slopes = None if c.slopes is None else c.slopes[..., None, None]  # (B|1, H) -> (.., 1, 1)
    s, _ = scores.modify(s, softcap=c.softcap or None, slopes=slopes, rows=rows,
                         cols=cols + c.pos_off, allowed=allowed)
    w, lse = scores.softmax(s)
    return (w @ vf).to(q.dtype), lse  # (B, H, L, S) @ (B, H, S, Dv) -> (B, H, L, Dv)
