"""The score pipeline: one order and one rule for every backend.

Every path that computes attention scores (the math backend, the tiled kernel's pure-PyTorch chunks,
`attention_weights`) computes them here, in this order, in the accumulation dtype:

    s = (q @ kᵀ) · scale                # the product first, then the scale, as PyTorch's fused
                                        # kernel rounds it (so its lse fits these scores)
    s = score_mod(s, b, h, i, j)        # a user's FlexAttention-style modifier, when given
    s = softcap · tanh(s / softcap)     # Gemma 2's soft-capping, when softcap is set
    s = s + slope_h · (j - i)           # ALiBi, when slopes are set
    s = s + bias                        # SDPA's float attn_mask
    s = -inf where a pair may not attend (structured masks and SDPA's bool attn_mask)

Rows with nothing to attend (every score -inf) get weights 0, lse -inf, output 0 and gradient 0,
never NaN: the row max that shifts the exponent is 0 for them (`exp_shift`), and weights
recomputed from an lse use +inf in its place (`lse_for_exp`), so exp(s - lse) = 0.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def accum_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp16/bf16 accumulate in fp32; fp32 and fp64 stay as they are."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def product(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """(q @ kᵀ) · scale for q (..., M, D), k (..., N, D), both in the accumulation dtype."""
    return (q @ k.transpose(-2, -1)) * scale  # (..., M, D) @ (..., D, N) -> (..., M, N)


def modify(s: torch.Tensor, *, softcap: float | None = None, slopes: torch.Tensor | None = None,
           rows: torch.Tensor | None = None, cols: torch.Tensor | None = None,
           bias: torch.Tensor | None = None, allowed: torch.Tensor | None = None):
    """(scores, t) after the product: softcap, ALiBi, float bias, bool mask, in that order.

    s: (..., R, C) scaled products. slopes: broadcastable to s's leading dims with two trailing
    1s, e.g. (H, 1, 1); rows (R,) and cols (C,) are the global positions i and j (needed with
    slopes). bias (float) and allowed (bool, True = may attend) broadcast to s.
    t: tanh(raw / softcap), which the softcap's gradient needs (None without softcap).
    In place on s unless autograd tracks it.
    """
    inplace = not (torch.is_grad_enabled() and s.requires_grad)
    t = None
    if softcap is not None:
        t = s.div_(softcap).tanh_() if inplace else torch.tanh(s / softcap)
        s = t * softcap
    if slopes is not None:
        rel = cols.to(s.dtype)[None, :] - rows.to(s.dtype)[:, None]  # (R, C): j - i
        s = _add(s, slopes * rel, inplace)  # (..., 1, 1) * (R, C) -> (..., R, C)
    if bias is not None:
        s = _add(s, bias.to(s.dtype), inplace)
    if allowed is not None:
        if inplace and _fits(s, allowed):
            s = s.masked_fill_(~allowed, NEG_INF)
        else:
            s = s.masked_fill(~allowed, NEG_INF)
    return s, t


def apply_score_mod(fn, s: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """fn(s, b, h, q_idx, kv_idx) on scores s (B, H, R, C), FlexAttention's convention with
    broadcast indices: b (B, 1, 1, 1), h (1, H, 1, 1), q_idx (1, 1, R, 1) = rows, kv_idx
    (1, 1, 1, C) = cols (global positions). Returns (B, H, R, C) in s's dtype."""
    from attnlab.errors import AttnlabError

    B, H, R, C = s.shape
    dev = s.device
    b = torch.arange(B, device=dev)[:, None, None, None]  # (B, 1, 1, 1)
    h = torch.arange(H, device=dev)[None, :, None, None]  # (1, H, 1, 1)
    out = fn(s, b, h, rows[None, None, :, None], cols[None, None, None, :])
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        raise AttnlabError(f"score_mod: must return a float tensor of scores, got "
                           f"{getattr(out, 'dtype', type(out).__name__)}")
    if tuple(out.shape) != (B, H, R, C):
        try:
            out = out.expand(B, H, R, C)
        except RuntimeError:
            raise AttnlabError(f"score_mod: returned shape {tuple(out.shape)}, expected the "
                               f"scores' (B, H, R, C) = ({B}, {H}, {R}, {C})") from None
    return out.to(s.dtype)


def _fits(s: torch.Tensor, x: torch.Tensor) -> bool:
    """x broadcasts to s without growing it (so s can take the result in place)."""
    if x.dim() > s.dim():
        return False
    return all(b in (1, a) for a, b in zip(s.shape[s.dim() - x.dim():], x.shape))


def _add(s: torch.Tensor, x: torch.Tensor, inplace: bool) -> torch.Tensor:
    return s.add_(x) if inplace and _fits(s, x) else s + x


def heads5(t: torch.Tensor | None, Hkv: int, G: int) -> torch.Tensor | None:
    """(B|1, H|1, a, b) -> (B|1, Hkv|1, G|1, a, b): a mask or bias in the grouped view of the
    scores (query head h = kv head h // G, group member h % G); None stays None."""
    if t is None:
        return None
    if t.shape[1] == 1:
        return t[:, :, None]  # (B|1, 1, a, b) -> (B|1, 1, 1, a, b)
    return t.reshape(t.shape[0], Hkv, G, *t.shape[2:])  # (B|1, H, a, b) -> (.., Hkv, G, ..)


def exp_shift(m: torch.Tensor) -> torch.Tensor:
    """The row max m as the shift of exp(s - shift): 0 where the row has no finite score, so a row
    with nothing to attend computes exp(-inf - 0) = 0 instead of exp(-inf + inf) = NaN."""
    return torch.where(torch.isfinite(m), m, 0.0)


def lse_for_exp(lse: torch.Tensor) -> torch.Tensor:
    """lse for weights exp(s - lse): +inf where it is -inf (nothing to attend), so they are 0."""
    return torch.where(lse == NEG_INF, float("inf"), lse)


def softmax(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, lse) of scores s (..., L, S) where -inf means masked; all-masked rows give 0, -inf;
    a row holding a NaN score gives NaN weights and lse, as every other backend.

    The row max is detached: softmax and lse are shift-invariant, so the gradient is unchanged.
    """
    m = s.detach().amax(dim=-1, keepdim=True) if s.shape[-1] else s.new_zeros(*s.shape[:-1], 1)
    m = exp_shift(m)  # (..., L, 1)
    e = torch.exp(s - m)
    total = e.sum(dim=-1, keepdim=True)  # (..., L, 1)
    alive = total != 0  # NaN stays alive: its lse is NaN, not -inf
    safe = torch.where(alive, total, torch.ones_like(total))  # log(0)'s gradient would be NaN
    weights = e / safe
    lse = torch.where(alive, m + torch.log(safe), NEG_INF).squeeze(-1)  # (..., L); -inf: no key
    return weights, lse


def head_slopes(slopes: torch.Tensor | None, ndim: int, dtype) -> torch.Tensor | None:
    """ALiBi slopes (H,) shaped to broadcast over (..., H, R, C) scores: (H, 1, 1), or a scalar
    for a call without a head dim (2-D query)."""
    if slopes is None:
        return None
    s = slopes.to(dtype)
    return s[:, None, None] if ndim > 2 else s[0]  # (H,) -> (H, 1, 1)
