"""Backend "math": attention as plain PyTorch ops, autograd by PyTorch.

Builds the full (..., H, L, S) score matrix, so memory is quadratic in length; it is the readable,
exact path and the fallback for every mask. Low-precision inputs are computed in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.ops.problem import Problem


def accum_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp16/bf16 accumulate in fp32; fp32 and fp64 stay as they are."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def masked_softmax(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, lse) of scores s (..., L, S) where -inf means masked; all-masked rows give 0, -inf.

    The row max is detached: softmax and lse are shift-invariant, so the gradient is unchanged,
    and an all-masked row never sees inf - inf.
    """
    m = s.detach().amax(dim=-1, keepdim=True) if s.shape[-1] else s.new_zeros(*s.shape[:-1], 1)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # (..., L, 1)
    e = torch.exp(s - m)
    total = e.sum(dim=-1, keepdim=True)  # (..., L, 1)
    weights = e / torch.where(total > 0, total, torch.ones_like(total))
    lse = (m + torch.log(total)).squeeze(-1)  # (..., L); log(0) = -inf for an all-masked row
    return weights, lse


def scores(p: Problem, key: torch.Tensor, allowed, bias) -> torch.Tensor:
    """Scaled, masked scores (..., H, L, S) in the accumulation dtype."""
    acc = accum_dtype(p.query.dtype)
    q, k = p.query.to(acc), key.to(acc)
    if p.dims.groups > 1:
        k = k.repeat_interleave(p.dims.groups, dim=-3)  # (..., Hkv, S, D) -> (..., H, S, D)
    s = (q @ k.transpose(-2, -1)) * p.scale  # (..., H, L, D) @ (..., H, D, S) -> (..., H, L, S)
    if p.softcap is not None:
        s = torch.tanh(s / p.softcap) * p.softcap
    if p.alibi_slopes is not None:
        alibi = alibi_bias(p.alibi_slopes.to(acc), p.dims.L, p.dims.S)  # (H, L, S)
        s = s + (alibi if p.dims.ndim > 2 else alibi[0])
    if bias is not None:
        s = s + bias.to(acc)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return s


def alibi_bias(slopes: torch.Tensor, L: int, S: int) -> torch.Tensor:
    """(H, L, S) ALiBi bias slope_h · (j - i); softmax ignores the per-row shift of alignment."""
    dt, dev = slopes.dtype, slopes.device
    rel = torch.arange(S, device=dev, dtype=dt) - torch.arange(L, device=dev, dtype=dt)[:, None]
    return slopes[:, None, None] * rel  # (H, 1, 1) * (L, S) -> (H, L, S)


def forward(p: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (..., H, L, Dv) in the input dtype, lse (..., H, L) in the accumulation dtype)."""
    allowed, bias = p.dense_masks()
    key, value = p.key, p.value  # NaN/Inf in them was handled before any backend (nonfinite)
    w, lse = masked_softmax(scores(p, key, allowed, bias))
    if p.dropout_p > 0:
        w = F.dropout(w, p.dropout_p, training=True)
    v = value.to(w.dtype)
    if p.dims.groups > 1:
        v = v.repeat_interleave(p.dims.groups, dim=-3)  # (..., Hkv, S, Dv) -> (..., H, S, Dv)
    out = w @ v  # (..., H, L, S) @ (..., H, S, Dv) -> (..., H, L, Dv)
    return out.to(p.query.dtype), lse
