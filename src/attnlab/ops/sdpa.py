"""Backend "sdpa": PyTorch's fused `scaled_dot_product_attention`, with attnlab's semantics.

attnlab adds what SDPA lacks: structured masks (passed as `is_causal` when that says it exactly,
else as a dense mask), NaN safety for keys/values no query may attend, and the log-sum-exp
(through the CPU flash kernel, which returns it) when `return_lse=True`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.ops.problem import Problem, merged_allowed, sanitize_dead_keys


def _dense_for_sdpa(p: Problem):
    """(attn_mask for SDPA or None, is_causal, allowed bool or None)."""
    if p.structured is None and p.attn_mask is None:
        return None, False, None
    if p.is_plain_causal:
        return None, True, None
    allowed, bias = p.dense_masks()
    if bias is None:
        return allowed, False, allowed
    ninf = torch.tensor(float("-inf"), dtype=bias.dtype, device=bias.device)
    merged = bias if allowed is None else torch.where(allowed, bias, ninf)
    return merged.to(p.query.dtype), False, merged_allowed(allowed, bias)


def _causal_dead(p: Problem):
    """Top-left causal with S > L leaves keys j >= L unseen by every query."""
    L, S = p.dims.L, p.dims.S
    if S <= L:
        return None
    cols = torch.arange(S, device=p.query.device)
    return (cols < L)[None, :].expand(max(L, 1), S)  # (L, S): "alive" as a fake allowed matrix


def forward(p: Problem, *, need_lse: bool):
    mask, is_causal, allowed = _dense_for_sdpa(p)
    key, value = sanitize_dead_keys(p, _causal_dead(p) if is_causal else allowed)
    if need_lse:
        out, lse = _flash_cpu(p, key, value, mask, is_causal)
        if allowed is not None:  # the kernel reports 0 for rows that see nothing; attnlab says -inf
            lse = lse.masked_fill(~allowed.any(dim=-1).expand(lse.shape), float("-inf"))
        return out, lse
    out = F.scaled_dot_product_attention(
        p.query, key, value, attn_mask=mask, dropout_p=p.dropout_p, is_causal=is_causal,
        scale=p.scale, enable_gqa=p.dims.groups > 1,
    )
    return out, None


def _flash_cpu(p: Problem, key, value, mask, is_causal):
    """The CPU flash kernel returns (out, lse); it wants 4-D, equal heads and a float mask."""
    q = p.query
    shape = q.shape
    if p.dims.groups > 1:
        key = key.repeat_interleave(p.dims.groups, dim=-3)  # (..., Hkv, S, D) -> (..., H, S, D)
        value = value.repeat_interleave(p.dims.groups, dim=-3)
    q4, k4, v4 = (x.reshape(-1, *x.shape[-3:]) if x.dim() >= 3 else x[None, None]
                  for x in (q, key, value))  # (B, H, L|S, D)
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(
            ~mask, float("-inf"))
    if mask is not None:
        mask = mask.expand(*shape[:-2], p.dims.L, p.dims.S) if q.dim() >= 3 else mask
        mask = mask.reshape(-1, *mask.shape[-3:]) if mask.dim() >= 3 else mask
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q4, k4, v4, p.dropout_p, is_causal, attn_mask=mask, scale=p.scale
    )
    out = out.reshape(*shape[:-1], p.dims.Dv)
    lse = lse.reshape(shape[:-1])
    return out, lse


def has_lse_kernel(device: torch.device) -> bool:
    return device.type == "cpu" and hasattr(
        torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
