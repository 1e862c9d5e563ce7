"""One validated attention call, with its masks merged, as every backend receives it.

The public op folds SDPA's `attn_mask` and `is_causal` and attnlab's `mask=` into two things:
`structured` (an attnlab Mask or None, what tiled kernels can reason about) and `attn_mask` (the
user's dense bool/float tensor or None, its extra leading dims of size 1 already dropped).
Backends that want one dense matrix call `dense_masks`; paths that need a few rows or columns
call `allowed_at` and `bias_at`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnlab.masks import Mask


@dataclass(frozen=True)
class Dims:
    """The sizes of one attention call, in the glossary's names.

    `batch` holds the leading dims before the head dim (empty when the inputs are 2-D).
    """

    batch: tuple[int, ...]
    H: int
    Hkv: int
    L: int
    S: int
    D: int
    Dv: int
    ndim: int = 4

    @property
    def groups(self) -> int:
        """Query heads per key/value head (1 when there are no heads at all)."""
        return self.H // self.Hkv if self.Hkv else 1

    @property
    def scores_shape(self) -> tuple[int, ...]:
        if self.ndim == 2:
            return (self.L, self.S)
        return (*self.batch, self.H, self.L, self.S)


@dataclass
class Problem:
    query: torch.Tensor  # (..., H, L, D)
    key: torch.Tensor  # (..., Hkv, S, D)
    value: torch.Tensor  # (..., Hkv, S, Dv)
    dims: Dims
    scale: float
    dropout_p: float
    structured: Mask | None  # causal / sliding window / ... ; True = may attend
    attn_mask: torch.Tensor | None  # SDPA's mask: bool (True = attend) or float (added)
    softcap: float | None = None  # scores -> softcap · tanh(scores / softcap), before any bias
    alibi_slopes: torch.Tensor | None = None  # (H,): adds slope_h · (j - i) to the scores
    #: FlexAttention's score_mod(score, b, h, q_idx, kv_idx) -> score, bound to this call; applied
    #: to the scaled product before every other modifier (`ops.scores.apply_score_mod`)
    score_mod: Callable | None = None
    #: learned attention sinks (H,): one extra logit per head in every row's softmax, no value
    #: (`ops.sinks`); the returned lse includes it
    sinks: torch.Tensor | None = None
    finite: bool = False  # key and value are known to hold no NaN/Inf (checked once per call)
    #: what a call derives once from its masks (the tiled plan), shared by copies of the Problem
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def has_modifiers(self) -> bool:
        """Score modifiers PyTorch's fused kernel cannot apply."""
        return (self.softcap is not None or self.alibi_slopes is not None
                or self.score_mod is not None)

    @property
    def is_plain_causal(self) -> bool:
        """Only a top-left causal mask: SDPA's is_causal=True expresses it exactly."""
        return (
            self.attn_mask is None
            and self.structured is not None
            and self.structured.is_top_left_causal
        )

    def dense_masks(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(allowed bool, bias float) broadcastable to (..., H, L, S); either may be None."""
        L, S = self.dims.L, self.dims.S
        allowed = None
        if self.structured is not None:
            allowed = self.structured.to_dense(L, S, device=self.query.device)  # (Bm, Hm, L, S)
            allowed = _fit(allowed, self.query.dim())
        bias = None
        if self.attn_mask is not None:
            if self.attn_mask.dtype == torch.bool:
                allowed = self.attn_mask if allowed is None else allowed & self.attn_mask
            else:
                bias = self.attn_mask
        return allowed, bias


    def allowed_at(self, rows: torch.Tensor | None = None, cols: torch.Tensor | None = None):
        """bool broadcastable to (..., H, R, C), or None when every pair may attend: which of the
        query rows `rows` (R,) may attend the key columns `cols` (C,) under every mask of the call,
        a float attn_mask's -inf entries included. None for rows/cols = all of them."""
        allowed = None
        if self.structured is not None:
            d, dev = self.dims, self.query.device
            r = torch.arange(d.L, device=dev) if rows is None else rows
            c = torch.arange(d.S, device=dev) if cols is None else cols
            allowed = _fit(self.structured.block(r, c, d.L, d.S), self.query.dim())  # (.., R, C)
        if self.attn_mask is not None:
            m = _at(self.attn_mask, rows, cols)
            m = m if m.dtype == torch.bool else m != float("-inf")
            allowed = m if allowed is None else allowed & m
        return allowed

    def bias_at(self, rows: torch.Tensor | None = None, cols: torch.Tensor | None = None):
        """The float attn_mask at rows × cols, broadcastable to (..., H, R, C), or None."""
        m = self.attn_mask
        if m is None or m.dtype == torch.bool:
            return None
        return _at(m, rows, cols)


def _at(m: torch.Tensor, rows, cols) -> torch.Tensor:
    """A (..., L|1, S|1) mask at rows × cols; a dim of size 1 stays broadcast."""
    if rows is not None and m.shape[-2] > 1:
        m = m.index_select(-2, rows)
    if cols is not None and m.shape[-1] > 1:
        m = m.index_select(-1, cols)
    return m


def _fit(mask4d: torch.Tensor, ndim: int) -> torch.Tensor:
    """Drop or add leading dims of a (Bm, Hm, L, S) mask so it broadcasts against `ndim`-dim
    scores without growing them (a 2-D or 3-D call has no batch dim)."""
    while mask4d.dim() > max(ndim, 2) and mask4d.shape[0] == 1:
        mask4d = mask4d[0]
    return mask4d
