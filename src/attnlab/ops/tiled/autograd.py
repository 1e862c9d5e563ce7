"""The tiled kernel's autograd Function and the runner the dispatcher calls.

Three layers, as in flash-attention: `fwd._fwd` / `bwd._bwd` are pure functions, `TiledAttention`
is the thin autograd Function (it saves q, k, v, out and lse: nothing of size L×S), and `forward`
is the runner.

Caution: no gradient flows to a float `attn_mask` or to ALiBi slopes (they are constants here;
"auto" picks the math backend when a float mask needs a gradient), nor through the returned lse.
"""

from __future__ import annotations

import torch

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
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _bwd(ctx.st, q, k, v, out, lse, dout.contiguous())
        return dq, dk, dv, None


def forward(p: Problem, need_lse: bool = True, *, fused: bool | None = None):
    """(out (..., H, L, Dv) in the input dtype, lse (..., H, L) in the accumulation dtype).

    fused: run each chunk on PyTorch's fused flash kernel (default: wherever `fused_cpu.applies`)
    or on plain PyTorch ops (False; always available).
    """
    d = p.dims
    if min(p.query.numel(), p.key.numel(), p.value.numel()) == 0:
        return plain.forward(p)  # nothing to tile; the math path has the semantics
    st = make_setup(p, fused=fused_cpu.applies(p) if fused is None else fused)
    q = p.query.reshape(st.B, d.H, d.L, d.D)  # (..., H, L, D) -> (B, H, L, D)
    k = p.key.reshape(st.B, d.Hkv, d.S, d.D)  # (..., Hkv, S, D) -> (B, Hkv, S, D)
    v = p.value.reshape(st.B, d.Hkv, d.S, d.Dv)  # (..., Hkv, S, Dv) -> (B, Hkv, S, Dv)
    if st.fused:  # the layouts the fused kernel reads right, copied once rather than per chunk
        q, k, v = (fused_cpu.laid_out(x) for x in (q, k, v))
    out, lse = TiledAttention.apply(q, k, v, st)
    out = out.reshape(*p.query.shape[:-1], d.Dv)  # (B, H, L, Dv) -> (..., H, L, Dv)
    return out, lse.reshape(p.query.shape[:-1])  # (B, H, L) -> (..., H, L)
