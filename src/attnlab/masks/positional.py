"""Masks that depend only on positions: causal, sliding_window, prefix_lm.

Alignment: with L queries and S keys, `align="top_left"` lets query i see key j <= i (SDPA's
`is_causal=True`); `align="bottom_right"` shifts the diagonal by S - L so the last query sees the
last key, which is what decoding with a KV cache needs (L new queries after S - L cached keys).
"""

from __future__ import annotations

import torch

from attnlab.errors import AttnlabError, check_choice
from attnlab.masks.base import Mask, classify

ALIGNS = ("top_left", "bottom_right")
INT64_MAX = 2**63 - 1


def _offset(align: str, L: int, S: int) -> int:
    return 0 if align == "top_left" else S - L


class Causal(Mask):
    """Query i sees keys j <= i (+ offset): no peeking ahead."""

    def __init__(self, align: str = "top_left"):
        check_choice("align", align, ALIGNS)
        self.align = align

    def _block(self, rows, cols, L, S):
        off = _offset(self.align, L, S)
        return cols[None, :] <= rows[:, None] + off  # (Lb, Sb)

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, L, S):
        off = _offset(self.align, L, S)
        return classify(k_hi <= q_lo + off, k_lo > q_hi + off)

    def __repr__(self):
        return f"causal(align={self.align!r})"


class SlidingWindow(Mask):
    """Query i sees keys j with i - size < j <= i (+ offset): the last `size` keys, itself too."""

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

    def __repr__(self):
        return f"sliding_window({self.size}, align={self.align!r})"


class KeyPrefix(Mask):
    """Every query sees keys j < prefix_length (per batch element when a sequence is given)."""

    def __init__(self, prefix_length):
        lengths = _lengths("prefix_length", prefix_length)
        self.lengths = lengths  # (Bm,)
        self.batch_size = lengths.numel()

    def _block(self, rows, cols, L, S):
        n = self.lengths.to(cols.device)[:, None, None, None]  # (Bm, 1, 1, 1)
        return (cols[None, None, None, :] < n).expand(-1, 1, len(rows), len(cols))

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, L, S):
        n = self.lengths.to(k_lo.device)[:, None, None, None]
        return classify((k_hi < n).expand(-1, 1, q_lo.shape[0], -1),
                        (k_lo >= n).expand(-1, 1, q_lo.shape[0], -1))

    def __repr__(self):
        return f"key_prefix({self.lengths.tolist()})"


def _lengths(name: str, x) -> torch.Tensor:
    """A 1-D int64 tensor of non-negative lengths from an int or a flat sequence/tensor of ints."""
    t = as_int_tensor(name, x, "integer lengths")
    if t.dim() > 1:
        raise AttnlabError(
            f"{name}: expected an int or a flat sequence of ints (one per batch element), got "
            f"shape {tuple(t.shape)}"
        )
    t = t.reshape(-1)
    if t.numel() == 0:
        raise AttnlabError(f"{name}: expected at least one length, got an empty sequence")
    if (t < 0).any():
        raise AttnlabError(f"{name}: expected lengths >= 0, got {t.tolist()}"[:200])
    return t


def as_int_tensor(name: str, x, what: str) -> torch.Tensor:
    """x as an int64 tensor, or AttnlabError naming `name` (strings, ragged nesting, floats,
    integers beyond int64 are refused)."""
    if isinstance(x, (str, bytes)) or (isinstance(x, torch.Tensor) and x.device.type == "meta"):
        raise AttnlabError(f"{name}: expected {what}, got {x!r}"[:200])
    try:
        t = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        why = "an integer beyond int64" if "overflow" in str(e).lower() else "not a regular " \
            "nesting of ints"
        raise AttnlabError(f"{name}: expected {what}, got {why}: {x!r}"[:200]) from None
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise AttnlabError(f"{name}: expected {what}, got dtype {t.dtype}")
    return t.to(torch.int64)


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
