"""attnlab.attention_weights: exact rows of the attention matrix, recomputed from the saved lse.

A fast kernel never stores the (L, S) weights, but it can return the log-sum-exp of each query row.
With it, any row of the weights is one dot-product pass away: w[i, j] = exp(s[i, j] - lse[i]),
where s is the scaled, modified and masked score. Only the requested rows are computed, so asking
for one row of a 64k-token attention costs one (1, S) score row per head.

Caution: these are the weights before dropout (dropout is random; the expectation is these).
"""

from __future__ import annotations

import torch

from attnlab.errors import AttnlabError, fmt_shape
from attnlab.ops import budget
from attnlab.ops.api import make_problem
from attnlab.ops.math import accum_dtype


def attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    lse: torch.Tensor,
    rows=None,
    mask=None,
    scale: float | None = None,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    enable_gqa: bool = False,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows of softmax(query · keyᵀ · scale + mask), exactly, from the lse of `attention`.

    Args:
        query: (..., H, L, D), as given to `attnlab.attention`.
        key: (..., Hkv, S, D).
        lse: (..., H, L), the log-sum-exp the attention call returned.
        rows: which query rows: None (all), an int, a slice, or a sequence/1-D tensor of ints.
        mask, scale, attn_mask, is_causal, enable_gqa, softcap, alibi_slopes: exactly as passed to
            the attention call (the weights are only right for the same masks and modifiers).

    Returns:
        (..., H, R, S) weights in the accumulation dtype (float32 for fp16/bf16), R = len(rows);
        each row sums to 1, a row with nothing to attend is all 0.
    """
    p = make_problem(query, key, None, attn_mask, 0.0, is_causal, scale, enable_gqa, mask=mask,
                     softcap=softcap, alibi_slopes=alibi_slopes)
    d = p.dims
    want = tuple(p.query.shape[:-1])  # query's (..., H, L), batch broadcast with key's
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != want:
        got = fmt_shape(lse.shape) if isinstance(lse, torch.Tensor) else type(lse).__name__
        raise AttnlabError(
            f"lse: expected (..., H, L) = {fmt_shape(want)} like query "
            f"{fmt_shape(query.shape)}, got {got}"
        )
    query, key = p.query, p.key
    idx = _rows(rows, d.L, query.device)
    acc = accum_dtype(query.dtype)
    scores = (*d.scores_shape[:-2], idx.numel(), d.S)
    budget.check("rows", f"attention_weights for {idx.numel()} rows", scores,
                 budget.entries(scores) * (3 * torch.empty((), dtype=acc).element_size() + 1),
                 "ask for fewer rows at a time, e.g. rows=slice(0, 1024)")
    if budget.entries(scores) == 0:
        return torch.zeros(scores, dtype=acc, device=query.device)  # nothing to weigh
    allowed = _allowed(p, idx)  # (..., H|1, R, S) or None
    cols = torch.arange(d.S, device=query.device)
    if allowed is not None and allowed.shape[-1] == d.S:
        alive = allowed.reshape(-1, d.S).any(0)  # (S,): keys some requested row may attend
        if 2 * int(alive.sum()) < d.S:  # e.g. a sliding window: score only those keys
            cols = alive.nonzero().squeeze(1)
            allowed = allowed[..., cols]
    part = cols.numel() < d.S
    k = key.index_select(-2, cols) if part else key  # (..., Hkv, S', D)
    q = query[..., idx, :].to(acc)  # (..., H, R, D)
    R = idx.numel()
    if d.ndim > 2:  # stack grouped heads along the rows: k is never repeated
        q = q.reshape(*d.batch, d.Hkv, d.groups * R, d.D)  # (..., Hkv, G·R, D)
    s = q @ k.to(acc).transpose(-2, -1)  # (..., Hkv, G·R, D) @ (..., Hkv, D, S') -> (.., G·R, S')
    if d.ndim > 2:
        s = s.reshape(*d.batch, d.H, R, cols.numel())  # (..., H, R, S')
    s = s * p.scale  # scaled after the product, as the kernels round it
    if p.softcap is not None:
        s = torch.tanh(s / p.softcap) * p.softcap
    if p.alibi_slopes is not None:
        rel = cols.to(acc)[None, :] - idx.to(acc)[:, None]  # (R, S'): j - i
        slopes = p.alibi_slopes.to(acc)
        s = s + (slopes[:, None, None] if d.ndim > 2 else slopes[0]) * rel
    if p.attn_mask is not None and p.attn_mask.dtype != torch.bool:
        b = p.attn_mask
        b = b[..., idx, :] if b.shape[-2] > 1 else b
        b = b[..., cols] if part and b.shape[-1] > 1 else b
        s = s + b.to(acc)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    l = lse[..., idx].to(acc).unsqueeze(-1)  # (..., H, R, 1)
    l = torch.where(l == float("-inf"), float("inf"), l)  # nothing to attend: weights 0
    w = torch.exp(s - l)
    if not part:
        return w
    out = w.new_zeros(*w.shape[:-1], d.S)
    return out.index_copy_(-1, cols, w)  # unattended keys: weight exactly 0


def _allowed(p, idx: torch.Tensor) -> torch.Tensor | None:
    """bool mask of the requested rows, broadcastable to (..., H, R, S)."""
    allowed = None
    if p.structured is not None:
        cols = torch.arange(p.dims.S, device=idx.device)
        allowed = p.structured.block(idx, cols, p.dims.L, p.dims.S)  # (Bm, Hm, R, S)
        while allowed.dim() > max(p.dims.ndim, 2) and allowed.shape[0] == 1:
            allowed = allowed[0]
    if p.attn_mask is not None:
        m = p.attn_mask
        m = m[..., idx, :] if m.shape[-2] > 1 else m
        m = m if m.dtype == torch.bool else m != float("-inf")
        allowed = m if allowed is None else allowed & m
    return allowed


def _rows(rows, L: int, device) -> torch.Tensor:
    """int64 (R,) row indices in [0, L) from None, an int, a slice or a 1-D sequence of ints."""
    if rows is None:
        return torch.arange(L, device=device)
    if isinstance(rows, slice):
        return torch.arange(L, device=device)[rows]
    what = "rows: expected an int, a slice or a 1-D sequence of ints"
    if isinstance(rows, (bool, str, bytes, set, frozenset, dict, float)):
        raise AttnlabError(f"{what}, got {type(rows).__name__} {rows!r}"[:200])
    if isinstance(rows, (list, tuple)) and len(rows) == 0:
        return torch.zeros(0, dtype=torch.int64, device=device)  # no rows: an empty result
    try:
        t = torch.as_tensor(rows, device=device)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise AttnlabError(f"{what}, got {rows!r}"[:200]) from None
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool or t.dim() > 1:
        raise AttnlabError(f"{what}, got {rows!r}"[:200])
    t = t.reshape(-1).to(torch.int64)
    if t.numel() and (int(t.min()) < -L or int(t.max()) >= L):
        raise AttnlabError(f"rows: indices must lie in [-{L}, {L}), got {t.tolist()}"[:200])
    return torch.where(t < 0, t + L, t)
