"""Masks that depend only on positions: causal, sliding_window, prefix_lm.

Alignment: with L queries and S keys, `align="top_left"` lets query i see key j <= i (SDPA's
`is_causal=True`); `align="bottom_right"` shifts the diagonal by S - L so the last query sees the
last key, which is what decoding with a KV cache needs (L new queries after S - L cached keys).
"""

from __future__ import annotations

import torch

from attnlab.errors import AttnlabError, check_choice
from attnlab.masks.base import Mask, classify
from attnlab.masks.sequence import KeyPrefix

ALIGNS = ("top_left", "bottom_right")
INT64_MAX = 2**63 - 1


def _offset(align: str, L: int, S: int) -> int:
    return 0 if align == "top_left" else S - L


class Causal(Mask):
    """Query i sees keys j <= i (+ offset): no peeking ahead."""

    shift_invariant = True

    def __init__(self, align: str = "top_left"):
        check_choice("align", align, ALIGNS)
        self.align = align

    @property
    def is_top_left_causal(self) -> bool:
        return self.align == "top_left"

    def simplified(self, L: int, S: int) -> Mask | None:
        """Bottom-right is top-left when L == S (prefill), which the fused kernel runs as
        is_causal=True, and allows every key when L == 1 (one decoding step)."""
        if self.align == "bottom_right":
            if L == S:
                return Causal("top_left")
            if L == 1:
                return None
        return self

    def _block(self, rows, cols, L, S):
        off = _offset(self.align, L, S)
        return cols[None, :] <= rows[:, None] + off  # (Lb, Sb)

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, L, S):
        off = _offset(self.align, L, S)
        return classify(k_hi <= q_lo + off, k_lo > q_hi + off)

    def _intervals(self, L, S, device):
        hi = torch.arange(L, device=device) + _offset(self.align, L, S) + 1  # (L,): keys j <= i
        return torch.zeros_like(hi), hi

    def mask_mod(self, L, S, device=None):
        off = _offset(self.align, L, S)
        return lambda b, h, q, k: k <= q + off

    def __repr__(self):
        return f"causal(align={self.align!r})"


class SlidingWindow(Mask):
    """Query i sees keys j with i - size < j <= i (+ offset): the last `size` keys, itself too."""

    shift_invariant = True

    def __init__(self, size: int, align: str = "top_left"):
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= INT64_MAX:
            raise AttnlabError(
                f"size: expected a positive int window size up to 2**63 - 1, got {size!r}"[:200])
        check_choice("align", align, ALIGNS)
        self.size, self.align = size, align

    def _size(self, L: int, S: int) -> int:
        """The window, capped where it already covers every key (no int64 overflow below)."""
        return min(self.size, max(L, S) + 1)

    def _block(self, rows, cols, L, S):
        last = rows[:, None] + _offset(self.align, L, S)  # (Lb, 1): the newest key row i sees
        # two broadcast comparisons: bool (Lb, Sb), never an int64 (Lb, Sb) distance matrix
        return (cols[None, :] <= last) & (cols[None, :] > last - self._size(L, S))

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, L, S):
        off, size = _offset(self.align, L, S), self._size(L, S)
        # distance d = i + off - j over the tile ranges from (q_lo - k_hi) to (q_hi - k_lo)
        d_min, d_max = q_lo + off - k_hi, q_hi + off - k_lo
        return classify((d_min >= 0) & (d_max < size), (d_max < 0) | (d_min >= size))

    def _intervals(self, L, S, device):
        hi = torch.arange(L, device=device) + _offset(self.align, L, S) + 1  # (L,)
        return hi - self._size(L, S), hi

    def mask_mod(self, L, S, device=None):
        off, size = _offset(self.align, L, S), self._size(L, S)
        return lambda b, h, q, k: (k <= q + off) & (k > q + off - size)

    def __repr__(self):
        return f"sliding_window({self.size}, align={self.align!r})"


def causal(align: str = "top_left") -> Causal:
    """Causal mask (no peeking ahead). `align="bottom_right"` for KV-cache decoding."""
    return Causal(align)


def sliding_window(size: int, align: str = "top_left") -> SlidingWindow:
    """Causal local attention: query i sees keys j with i - size < j <= i."""
    return SlidingWindow(size, align)


def prefix_lm(prefix_length, align: str = "top_left") -> Mask:
    """Prefix-LM: keys j < prefix_length are seen by all queries, the rest causally.

    `prefix_length` is an int or one length per batch element.
    """
    return Causal(align) | KeyPrefix(prefix_length)
