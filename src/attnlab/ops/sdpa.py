"""Backend "sdpa": PyTorch's fused `scaled_dot_product_attention`, with attnlab's semantics.

attnlab adds what SDPA lacks: structured masks (passed as `is_causal` when that says it exactly,
else as a dense mask) and the log-sum-exp when `return_lse=True`, through the CPU flash kernel
behind `fused_cpu` (which returns it). That lse carries a gradient: `_FlashLse` runs the
kernel's backward with the lse's gradient folded in (`fused_cpu.with_lse_grad`). Non-finite
keys/values are handled before any backend runs (`ops.nonfinite`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from attnlab.ops import fused_cpu, scores, second_order
from attnlab.ops.problem import Problem


def _dense_for_sdpa(p: Problem):
    """(attn_mask for SDPA or None, is_causal)."""
    if p.structured is None and p.attn_mask is None:
        return None, False
    if p.is_plain_causal:
        return None, True
    allowed, bias = p.dense_masks()
    if bias is None:
        return allowed, False
    ninf = torch.tensor(float("-inf"), dtype=bias.dtype, device=bias.device)
    merged = bias if allowed is None else torch.where(allowed, bias, ninf)
    return merged.to(p.query.dtype), False


def forward(p: Problem, *, need_lse: bool):
    mask, is_causal = _dense_for_sdpa(p)
    if need_lse:
        return _flash_cpu(p, mask, is_causal)
    if _flash_for_grad(p):  # the same kernel as SDPA's, through a Function with a second order
        if mask is None and lean_applies(p.query, p.key, p.value, is_causal, p.scale):
            q, k, v = (fused_cpu.laid_out(x) for x in (p.query, p.key, p.value))
            return flash(q, k, v, is_causal, p.scale), None
        return _flash_cpu(p, mask, is_causal)[0], None
    q, scale = fused_cpu.fold_scale(p.query, p.scale, is_causal)  # a scale <= 0 with causal
    out = F.scaled_dot_product_attention(
        q, p.key, p.value, attn_mask=mask, dropout_p=p.dropout_p, is_causal=is_causal,
        scale=scale, enable_gqa=p.dims.groups > 1,
    )
    if p.query.device.type != "cpu":  # the device kernels' backward has no second order
        return second_order.no_second_order('backend "sdpa" on a device', out, None)
    return out, None


def _flash_for_grad(p: Problem) -> bool:
    """A CPU call that records gradients and that PyTorch's SDPA would run on its flash kernel,
    whose backward has no derivative: run by `_FlashLse`, which recomputes on the math path for
    a double backward. (SDPA's own math path, which it takes for dropout or Dv != D, has one.)"""
    return (torch.is_grad_enabled() and fused_cpu.applies(p)
            and any(x.requires_grad for x in (p.query, p.key, p.value)))


def _flash_cpu(p: Problem, mask, is_causal):
    """(out, lse) from the CPU flash kernel: 4-D inputs, equal heads, a float mask."""
    q, key, value = p.query, p.key, p.value
    key, value = _to_heads(key, value, p.dims.groups)  # (..., Hkv, S, D) -> (..., H, S, D)
    q4, k4, v4 = (_as4(x, q.shape) for x in (q, key, value))  # (B, H, L|S, D)
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(
            ~mask, float("-inf"))
    if mask is not None:
        mask = _as4(mask, q.shape)  # (B|1, H|1, L|1, S|1): broadcast dims stay unexpanded
    out, lse = _FlashLse.apply(q4, k4, v4, mask, is_causal, p.scale)
    out = out.reshape(*q.shape[:-1], p.dims.Dv)  # (B, H, L, Dv) -> (..., H, L, Dv)
    return out, lse.reshape(q.shape[:-1])  # (B, H, L) -> (..., H, L)


def _as4(x: torch.Tensor, q_shape) -> torch.Tensor:
    """A tensor broadcastable to (..., H, L, X) (q_shape's dims) as 4-D (B|1, H|1, L|1, X) with
    the batch dims flattened; a mask's broadcast dims stay size 1 unless the batch needs them."""
    n = len(q_shape)
    x = x.reshape((1,) * (n - x.dim()) + tuple(x.shape))  # leading 1s: n dims like q
    if n <= 4:
        return x.reshape((1,) * (4 - n) + tuple(x.shape))  # (H|1, L|1, X) -> 4-D
    nb = n - 3
    if all(s == 1 for s in x.shape[:nb]):
        return x.reshape(1, *x.shape[nb:])  # (1, .., 1, H|1, L|1, X) -> (1, H|1, L|1, X)
    x = x.expand(*q_shape[:nb], *x.shape[nb:])  # (.., H|1, L|1, X) -> (*batch, H|1, L|1, X)
    return x.reshape(-1, *x.shape[nb:])  # -> (B, H|1, L|1, X)


class _FlashLse(torch.autograd.Function):
    """The CPU flash kernel as (out, lse), both differentiable (the mask is a constant: dispatch
    sends a float attn_mask that needs a gradient to the math path)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, is_causal: bool, scale: float):
        out, lse = fused_cpu.forward(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse, mask)  # all a backward reads: hooks see it
        ctx.is_causal, ctx.scale = is_causal, scale
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, mask = ctx.saved_tensors
        if second_order.wanted():  # create_graph=True: the math path's gradients, by autograd
            B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
            second_order.check('backend "sdpa"', (B, H, L, S), q.element_size())
            fwd = functools.partial(_math, mask, ctx.is_causal, ctx.scale)
            return (*second_order.grads(fwd, (q, k, v), dout, dlse), None, None, None)
        if dout is None:  # only the lse is differentiated
            dout = torch.zeros_like(out)
        if dlse is not None and not bool(dlse.any()):
            dlse = None  # the kernel's own backward, no extra column
        dq, dk, dv = fused_cpu.backward(dout, q, k, v, out, lse, scale=ctx.scale,
                                        attn_mask=mask, is_causal=ctx.is_causal, dlse=dlse)
        return dq, dk, dv, None, None, None


def lean_applies(q, k, v, is_causal: bool, scale: float) -> bool:
    """`flash` computes this call (no mask tensor, no lse): inputs of one dimensionality, 2-D (L,
    D) (one head), 3-D (H, L, D) or 4-D of one batch (no broadcast batch), the query's heads
    those of the keys and values or a multiple of them (grouped heads: SDPA's enable_gqa), and a
    scale the kernel applies as it is (`fused_cpu.fold_scale`: not <= 0 with causal)."""
    nd = q.dim()
    if not (k.dim() == v.dim() == nd and 2 <= nd <= 4 and (scale > 0 or not is_causal)):
        return False
    if nd == 4 and not q.shape[0] == k.shape[0] == v.shape[0]:
        return False
    return nd == 2 or (k.shape[-3] == v.shape[-3] > 0 and q.shape[-3] % k.shape[-3] == 0)


_FWD = getattr(getattr(torch.ops.aten, fused_cpu.FWD, None), "default", None)
_BWD = getattr(getattr(torch.ops.aten, fused_cpu.BWD, None), "default", None)


class _Flash(torch.autograd.Function):
    """The CPU flash kernel's out alone, for a call SDPA states exactly (no mask or top-left
    causal, equal heads, no lse asked): `_FlashLse`'s forward and backward with nothing around
    the two kernel calls (no row is empty, so the kernel's lse is the true one; no lse gradient
    column), so a small call with a gradient costs about what SDPA's own autograd costs. A
    backward asked for a graph recomputes on the math path, as `_FlashLse` does.

    q (B, H, L, D), k, v (B, H, S, D), laid out as the kernel reads them (`fused_cpu.laid_out`).
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal: bool, scale: float):
        out, lse = _FWD(q, k, v, 0.0, is_causal, attn_mask=None, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)  # all a backward reads: hooks see it
        ctx.is_causal, ctx.scale = is_causal, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        if second_order.wanted():  # create_graph=True: the math path's gradients, by autograd
            second_order.check('backend "sdpa"', (*q.shape[:3], k.shape[2]), q.element_size())
            fwd = functools.partial(_math, None, ctx.is_causal, ctx.scale)
            return (*second_order.grads(fwd, (q, k, v), dout, None), None, None)
        dq, dk, dv = _BWD(fused_cpu.laid_out(dout), q, k, v, out, lse, 0.0,
                                  ctx.is_causal, attn_mask=None, scale=ctx.scale)
        return dq, dk, dv, None, None


_APPLY = super(torch.autograd.Function, _Flash).apply  # autograd's own apply, in C
_TRANSFORMS = torch._C._are_functorch_transforms_active


#: the autograd node of PyTorch's CPU flash kernel (`F.scaled_dot_product_attention` with a
#: gradient): its backward has no derivative, which `_twice` supplies
_NODE = "ScaledDotProductFlashAttentionForCpuBackward0"


def flash(q, k, v, is_causal: bool, scale: float):
    """out of a call `lean_applies` takes (q, k, v laid out as `_Flash` takes them; grouped heads
    where k and v have fewer), with SDPA's own autograd node: F.scaled_dot_product_attention as
    it is (enable_gqa for grouped heads), its node given a pre-hook (`_twice`) that, only for a
    backward asked to build a graph, hands the node's gradients over to the math path's
    recomputation; a first-order backward is SDPA's alone (no Python Function around it). Where
    this PyTorch runs SDPA on another node, `_Flash` (outside functorch's transforms through
    autograd's C apply, without `Function.apply`'s Python wrapping), on keys and values
    repeated to the query's heads (autograd sums their gradients back). 2-D and 3-D inputs run
    as views with leading dims of 1 (SDPA's flash kernel takes 4-D ones: on fewer dims it runs
    its math path), the output viewed back (a view node over the flash node)."""
    nd = q.dim()
    if nd < 4:
        shape = (*q.shape[:-1], v.shape[-1])  # (.., L, Dv)
        q, k, v = (x.view((1,) * (4 - nd) + tuple(x.shape)) for x in (q, k, v))  # (1, .., n)
        return _flash4(q, k, v, is_causal, scale).view(shape)  # (1, H|1, L, Dv) -> (.., L, Dv)
    return _flash4(q, k, v, is_causal, scale)


def _flash4(q, k, v, is_causal: bool, scale: float):
    """`flash` of 4-D q (B, H, L, D), k, v (B, Hkv, S, D|Dv)."""
    groups = q.shape[1] // k.shape[1]
    out = F.scaled_dot_product_attention(q, k, v, None, 0.0, is_causal, scale=scale,
                                         enable_gqa=groups > 1)
    node = out.grad_fn
    if node is None:
        return out
    if type(node).__name__ == _NODE:
        node.register_prehook(_twice)
        return out
    k, v = _to_heads(k, v, groups)  # (B, Hkv, S, D) -> (B, H, S, D)
    if _TRANSFORMS():
        return _Flash.apply(q, k, v, is_causal, scale)
    return _APPLY(q, k, v, is_causal, scale)


def _twice(grad_outputs):
    """Pre-hook of SDPA's flash node (`flash`): in a backward asked to build a graph
    (create_graph=True), the gradients of the math path's recomputation from the node's saved
    inputs replace the node's own (a post-hook added here, used once); else nothing."""
    if not second_order.wanted():
        return None
    node = torch._C._current_autograd_node()
    q, k, v = node._saved_query, node._saved_key, node._saved_value  # through saved-tensor hooks
    scale = node._saved_scale
    scale = q.shape[-1] ** -0.5 if scale is None else scale  # SDPA's default
    second_order.check('backend "sdpa"', (*q.shape[:3], k.shape[2]), q.element_size())
    fwd = functools.partial(_math, None, node._saved_is_causal, scale)
    box = [second_order.grads(fwd, (q, k, v), grad_outputs[0], None)]

    def replace(grad_inputs, _):  # once: a graph kept for another backward runs _twice again
        got, box[0] = box[0], None
        return got

    node.register_hook(replace)
    return None


def _to_heads(k, v, groups: int):
    """k, v (..., Hkv, S, n) of grouped heads repeated `groups` times each, to the query's H =
    groups * Hkv (autograd sums their gradients back over each group); as they are for 1."""
    if groups == 1:
        return k, v
    return k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)


def _math(mask, is_causal: bool, scale: float, q, k, v):
    """`_FlashLse`'s (out, lse) with differentiable PyTorch ops: q (B, H, L, D), k, v (B, H, S,
    D|Dv) or (B, Hkv, S, D|Dv) for grouped heads (SDPA's own node, `flash`: repeated here, so
    their gradients come back summed over each group), mask float broadcastable to (B, H, L,
    S) or None."""
    k, v = _to_heads(k, v, q.shape[-3] // k.shape[-3])  # (B, Hkv, S, n) -> (B, H, S, n)
    acc = scores.accum_dtype(q.dtype)
    s = scores.product(q.to(acc), k.to(acc), scale)  # (B, H, L, D) @ (B, H, D, S) -> (.., L, S)
    allowed = None
    if is_causal:
        L, S = s.shape[-2:]
        allowed = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()  # top-left
    s, _ = scores.modify(s, bias=mask, allowed=allowed)
    w, lse = scores.softmax(s)
    return (w @ v.to(acc)).to(q.dtype), lse  # (B, H, L, S) @ (B, H, S, Dv) -> (B, H, L, Dv)
