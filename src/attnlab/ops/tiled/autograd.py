"""The tiled kernel's autograd Function, the runner the dispatcher calls, and the backward from a
given out and lse.

Three layers, as in flash-attention: `fwd._fwd` / `bwd._bwd` are pure functions, `TiledAttention`
is the thin autograd Function (it saves q, k, v, out and lse: nothing of size L×S), and `forward`
is the runner. Both outputs are differentiable: the lse's gradient enters the backward's row term
(`tiled.bwd`).

`backward(problem, out, lse, dout, dlse)` is the backward alone, for callers that computed the
forward themselves, e.g. a context-parallel block whose rows' out and lse cover keys on other
ranks too (`attnlab.distributed.blocks`).

Caution: no gradient flows to a float `attn_mask` or to ALiBi slopes (they are constants here;
"auto" picks the math backend when a float mask needs a gradient).
"""

from __future__ import annotations

import torch

from attnlab.errors import AttnlabError
from attnlab.ops import fused_cpu, plain
from attnlab.ops.problem import Problem
from attnlab.ops.tiled.bwd import _bwd
from attnlab.ops.tiled.fwd import _fwd
from attnlab.ops.tiled.setup import Setup, make_setup


class TiledAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, st: Setup):
        out, lse = _fwd(st, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.st = st
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        dq, dk, dv = _bwd(ctx.st, q, k, v, out, lse, dout, _nonzero(dlse))
        return dq, dk, dv, None


def _nonzero(dlse: torch.Tensor | None) -> torch.Tensor | None:
    """dlse, or None where it is absent or all zero (the backward then skips its term)."""
    return None if dlse is None or not bool(dlse.any()) else dlse


def forward(p: Problem, need_lse: bool = True, *, fused: bool | None = None):
    """(out (..., H, L, Dv) in the input dtype, lse (..., H, L) in the accumulation dtype).

    fused: run each chunk on PyTorch's fused flash kernel (default: wherever `fused_cpu.applies`)
    or on plain PyTorch ops (False; always available).
    """
    d = p.dims
    if min(p.query.numel(), p.key.numel(), p.value.numel()) == 0:
        return plain.forward(p)  # nothing to tile; the math path has the semantics
    st = make_setup(p, fused=fused_cpu.applies(p) if fused is None else fused)
    q, k, v = _kernel_inputs(p, st)
    out, lse = TiledAttention.apply(q, k, v, st)
    out = out.reshape(*p.query.shape[:-1], d.Dv)  # (B, H, L, Dv) -> (..., H, L, Dv)
    return out, lse.reshape(p.query.shape[:-1])  # (B, H, L) -> (..., H, L)


def _kernel_inputs(p: Problem, st: Setup):
    """q (B, H, L, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv): the batch dims flattened."""
    d = p.dims
    q = p.query.reshape(st.B, d.H, d.L, d.D)  # (..., H, L, D) -> (B, H, L, D)
    k = p.key.reshape(st.B, d.Hkv, d.S, d.D)  # (..., Hkv, S, D) -> (B, Hkv, S, D)
    v = p.value.reshape(st.B, d.Hkv, d.S, d.Dv)  # (..., Hkv, S, Dv) -> (B, Hkv, S, Dv)
    if st.fused:  # the layouts the fused kernel reads right, copied once rather than per chunk
        q, k, v = (fused_cpu.laid_out(x) for x in (q, k, v))
    return q, k, v


def backward(p: Problem, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor,
             dlse: torch.Tensor | None = None, *, fused: bool | None = None):
    """(dq, dk, dv) of the call `p` (no dropout), given its rows' out (..., H, L, Dv) and lse
    (..., H, L) and their gradients dout and dlse (None: zero).

    out and lse may be global: the rows' output and log-sum-exp over a larger key set of which
    p's keys are a part; the result is then p's keys' exact share (dq summed over the parts gives
    the whole dq). Rows with lse -inf get zero gradient. The caller gives k and v without NaN/Inf
    in positions no row of `p` attends (or zeroed there). Grouped heads never copy k or v.

    dq has q's dtype; dk, dv have k's and v's (each part accumulates in the accumulation dtype).
    """
    if p.dropout_p:
        raise AttnlabError("dropout_p: tiled.backward has no dropout to replay; pass 0")
    d = p.dims
    if min(p.query.numel(), p.key.numel(), p.value.numel()) == 0:
        return torch.zeros_like(p.query), torch.zeros_like(p.key), torch.zeros_like(p.value)
    st = make_setup(p, fused=fused_cpu.applies(p) if fused is None else fused)
    q, k, v = _kernel_inputs(p, st)
    rows = (st.B, d.H, d.L)
    out = out.reshape(*rows, d.Dv)  # (..., H, L, Dv) -> (B, H, L, Dv)
    dout = dout.reshape(*rows, d.Dv).contiguous()  # like out
    lse = lse.reshape(rows)  # (..., H, L) -> (B, H, L)
    if dlse is not None:
        dlse = _nonzero(dlse.reshape(rows))  # like lse
    dq, dk, dv = _bwd(st, q, k, v, out, lse, dout, dlse)
    return (dq.reshape(p.query.shape), dk.reshape(p.key.shape),  # (B, H|Hkv, ·, ·) -> (..., ·)
            dv.reshape(p.value.shape))
