"""The interval kernel in three layers: the pure `_fwd` / `_bwd` on a checked Call, the autograd
Function, and the public functions (exported by `attnlab.ops.kernels`)."""

from __future__ import annotations

import torch

from attnlab.ops.kernels import build, gate
from attnlab.ops.kernels.gate import Call


def _ops(isa: str | None):
    ops = build.get(isa)
    if ops is None:
        st = build.status()
        raise RuntimeError(f"the interval kernel is not available: {st.reason}")
    return ops


def _fwd(c: Call, q, k, v, isa=None):
    """(out (B, H, L, Dv) in q's dtype, lse float32 (B, H, L)) and the prepared (q, kᵀ, v)."""
    if c.empty:
        out = q.new_zeros(c.B, c.H, c.L, c.Dv)
        return out, q.new_full((c.B, c.H, c.L), float("-inf"), dtype=torch.float32), None
    qf, kt, vp = gate.dense(q), gate.keys_last(k), gate.rows_padded(v)
    out, lse = _ops(isa).fwd(qf, kt, vp, c.lo, c.hi, c.slopes, c.scale, c.softcap, c.pos_off,
                             c.Dv)
    return out.to(q.dtype), lse, (qf, kt, vp)


def _bwd(c: Call, q, k, v, out, lse, dout, dlse=None, prepared=None, isa=None):
    """(dq, dk, dv) in q's, k's and v's dtypes; rows with lse -inf get zero gradient."""
    if c.empty:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    qf, kt, vp = prepared or (gate.dense(q), gate.keys_last(k), gate.rows_padded(v))
    go = gate.dense(dout)  # (B, H, L, Dv)
    delta = (go * out.to(torch.float32)).sum(-1)  # rowsum(dO ∘ O): (B, H, L)
    if dlse is not None:
        delta = delta - dlse.to(torch.float32)
    lse = gate.dense(lse)
    dq, dk, dv = _ops(isa).bwd(qf, gate.rows_padded(k), kt, vp, gate.keys_last(v), c.lo, c.hi,
                               c.slopes, lse, delta.contiguous(), go, c.scale, c.softcap,
                               c.pos_off)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class IntervalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, c: Call, isa):
        out, lse, prepared = _fwd(c, q, k, v, isa)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.c, ctx.isa, ctx.prepared = c, isa, prepared
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv = _bwd(ctx.c, q, k, v, out, lse, dout, dlse, ctx.prepared, ctx.isa)
        return dq, dk, dv, None, None
