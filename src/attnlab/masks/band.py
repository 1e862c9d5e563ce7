"""Band masks: every query row attends one interval of keys, lo(b, h, i) <= j < hi(b, h, i).

`Band` derives everything a mask gives from the per-row bounds of its subclasses (`_bounds`):
the block (two broadcast comparisons), the per-row key intervals (O(L), never L×S), and exact
tile classes in O(L + tiles): a tile is FULL when its rows' largest lo and smallest hi cover it,
and nonempty when some row's interval meets its columns (counted with a difference array), all
on the device of the call, without a host sync.

`Window` is the two-sided window of flash-attention's `window_size=(left, right)` and xformers'
`LocalAttentionFromBottomRightMask(left, right)`: query i sees keys j with
i + off - left <= j <= i + off + right, where off is 0 (top-left), S - L (bottom-right) or, for
a ragged padded batch, key_lengths[b] - query_lengths[b] (aligned on each sequence's real
lengths, as flash-attention's varlen and KV-cache paths do). left/right None = unbounded.
"""

from __future__ import annotations

import torch

from attnlab.errors import AttnlabError, check_choice
from attnlab.masks.base import Mask, classify
from attnlab.masks.sequence import _lengths

ALIGNS = ("top_left", "bottom_right")


class Band(Mask):
    """Base of masks whose rows each attend one interval of keys. Subclasses give `_bounds`."""

    def _bounds(self, rows: torch.Tensor, L: int, S: int) -> tuple[torch.Tensor, torch.Tensor]:
        """int64 (lo, hi), each (Bm|1, Hm|1, R), within [0, S]: row rows[r] sees lo <= j < hi."""
        raise NotImplementedError

    def _block(self, rows, cols, L, S):
        lo, hi = self._bounds(rows, L, S)  # (Bm|1, Hm|1, R)
        c = cols[None, None, None, :]  # (1, 1, 1, C)
        return (c >= lo[..., None]) & (c < hi[..., None])  # (Bm|1, Hm|1, R, C)

    def _intervals(self, L, S, device):
        """(lo, hi) (Bm|1, Hm|1, L) from the bounds: every band mask is interval-shaped."""
        return self._bounds(torch.arange(L, device=device), L, S)

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, L, S):
        dev = q_lo.device
        lo, hi = self._bounds(torch.arange(L, device=dev), L, S)
        lo, hi = torch.broadcast_tensors(lo, hi)  # (Bm, Hm, L)
        return band_tiles(lo, hi, q_lo[:, 0], k_lo[0], k_hi[0])


def band_tiles(lo: torch.Tensor, hi: torch.Tensor, q_first: torch.Tensor, k_first: torch.Tensor,
               k_last: torch.Tensor) -> torch.Tensor:
    """Exact int8 tile classes (Bm, Hm, nQ, nK) of per-row intervals lo, hi (Bm, Hm, L).

    q_first (nQ,): first row of each query block; k_first, k_last (nK,): first and last column
    of each key block. Device-side only: block ids come from searchsorted, not from sizes.
    """
    Bm, Hm, L = lo.shape
    nq, nk = q_first.numel(), k_first.numel()
    if nq == 0 or nk == 0:
        return torch.zeros(Bm, Hm, nq, nk, dtype=torch.int8, device=lo.device)
    rows = torch.arange(L, device=lo.device)
    blk = torch.searchsorted(q_first, rows, right=True) - 1  # (L,): query block of each row
    flat_lo, flat_hi = lo.reshape(-1, L), hi.reshape(-1, L)  # (Bm·Hm, L)
    n = flat_lo.shape[0]
    idx = blk.expand(n, L)
    big = torch.iinfo(torch.int64).max
    max_lo = torch.full((n, nq), -1, dtype=torch.int64, device=lo.device).scatter_reduce(
        1, idx, flat_lo, "amax")  # (Bm·Hm, nQ)
    min_hi = torch.full((n, nq), big, dtype=torch.int64, device=lo.device).scatter_reduce(
        1, idx, flat_hi, "amin")
    full = (max_lo[:, :, None] <= k_first) & (min_hi[:, :, None] > k_last)  # (Bm·Hm, nQ, nK)
    # nonempty: each live row touches the key blocks a..b; count them with a difference array
    live = flat_lo < flat_hi
    a = torch.searchsorted(k_first, flat_lo.clamp(max=k_last[-1]).contiguous(), right=True) - 1
    b = torch.searchsorted(k_first, (flat_hi - 1).clamp(min=0).contiguous(), right=True)
    diff = torch.zeros(n, nq, nk + 1, dtype=torch.int64, device=lo.device)
    one = live.to(torch.int64)
    flat = diff.view(n, -1)  # (Bm·Hm, nQ·(nK+1))
    flat.scatter_add_(1, idx * (nk + 1) + a, one)
    flat.scatter_add_(1, idx * (nk + 1) + b, -one)
    touched = diff.cumsum(-1)[..., :nk] > 0  # (Bm·Hm, nQ, nK)
    return classify(full, ~touched).reshape(Bm, Hm, nq, nk)


class Window(Band):
    """Query i sees keys j with i + off - left <= j <= i + off + right (None = unbounded)."""

    def __init__(self, left=None, right=None, align: str = "top_left", query_lengths=None,
                 key_lengths=None):
        self.left, self.right = _reach("left", left), _reach("right", right)
        check_choice("align", align, ALIGNS)
        if (query_lengths is not None or key_lengths is not None) and align != "bottom_right":
            raise AttnlabError(
                f"align: real query/key lengths only define a bottom-right alignment; pass "
                f"align='bottom_right', got {align!r}"
            )
        self.align = align
        self.q_len = None if query_lengths is None else _lengths("query_lengths", query_lengths)
        self.k_len = None if key_lengths is None else _lengths("key_lengths", key_lengths)
        sizes = {t.numel() for t in (self.q_len, self.k_len) if t is not None}
        if len(sizes) > 1 and 1 not in sizes:
            raise AttnlabError(
                f"key_lengths: {self.k_len.numel()} entries but query_lengths has "
                f"{self.q_len.numel()}; expected one per batch element"
            )
        self.batch_size = max(sizes, default=1)
        self.ragged = bool(sizes)

    def check(self, L, S):
        for name, t, n in (("query_lengths", self.q_len, L), ("key_lengths", self.k_len, S)):
            if t is not None and int(t.max()) > n:
                raise AttnlabError(
                    f"{name}: lengths {t.tolist()} exceed the padded length {n}"[:200])

    @property
    def shift_invariant(self) -> bool:
        return not self.ragged

    @property
    def is_top_left_causal(self) -> bool:
        return (self.left is None and self.right == 0 and self.align == "top_left"
                and not self.ragged)

    def simplified(self, L: int, S: int) -> Mask | None:
        if self.ragged:
            return self
        from attnlab.masks.positional import Causal

        off = 0 if self.align == "top_left" else S - L
        if self.right == 0 and (self.left is None or self.left >= L + S) and off == 0:
            return Causal("top_left")  # the fused kernel runs it as is_causal=True
        reach_all = L + S + abs(off)
        if (self.left is None or self.left >= reach_all) and (
                self.right is None or self.right >= reach_all):
            return None
        return self

    def _offset(self, L: int, S: int, device) -> torch.Tensor | int:
        """0, S - L, or int64 (Bm, 1, 1) per-batch k_len - q_len."""
        if not self.ragged:
            return 0 if self.align == "top_left" else S - L
        kl = torch.tensor([S]) if self.k_len is None else self.k_len
        ql = torch.tensor([L]) if self.q_len is None else self.q_len
        return (kl - ql).to(device)[:, None, None]  # (Bm, 1, 1)

    def _bounds(self, rows, L, S):
        cap = L + S + 1  # a reach beyond every key: no int64 overflow below
        left = cap if self.left is None else min(self.left, cap)
        right = cap if self.right is None else min(self.right, cap)
        at = rows[None, None, :] + self._offset(L, S, rows.device)  # (Bm|1, 1, R): i + off
        lo = (at - left).clamp(0, S)
        hi = (at + right + 1).clamp(0, S)
        return lo, hi

    def __repr__(self):
        extra = ""
        if self.ragged:
            ql = None if self.q_len is None else self.q_len.tolist()
            kl = None if self.k_len is None else self.k_len.tolist()
            extra = f", query_lengths={ql}, key_lengths={kl}"
        return f"window({self.left}, {self.right}, align={self.align!r}{extra})"


def _reach(name: str, x) -> int | None:
    """A window reach: None (or a negative int, flash-attention's -1) = unbounded, else int >= 0."""
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int):
        raise AttnlabError(f"{name}: expected an int >= 0 or None (unbounded), got {x!r}"[:200])
    return None if x < 0 else x


def window(left=None, right=None, align: str = "top_left", *, query_lengths=None,
           key_lengths=None) -> Window:
    """Two-sided local attention: query i sees keys j with i + off - left <= j <= i + off + right.

    off = 0 for align="top_left", S - L for "bottom_right" (flash-attention's and xformers'
    alignment), or key_lengths[b] - query_lengths[b] when the real lengths of a right-padded batch
    are given (each sequence aligned on its own lengths; combine with `padding(...)` to mask the
    padding itself). left/right None (or -1, as flash-attention writes it) = unbounded, so
    window(None, 0) is causal and window(size - 1, 0) is sliding_window(size).
    """
    return Window(left, right, align, query_lengths, key_lengths)


def ragged_causal(query_lengths=None, key_lengths=None) -> Window:
    """Causal attention aligned bottom-right on each sequence's real lengths in a right-padded
    batch: query i sees keys j <= i + key_lengths[b] - query_lengths[b] (a missing length is the
    padded one). `causal("bottom_right")` aligns on the padded S - L instead."""
    if query_lengths is None and key_lengths is None:
        raise AttnlabError("ragged_causal: pass query_lengths, key_lengths or both")
    return Window(None, 0, "bottom_right", query_lengths, key_lengths)
