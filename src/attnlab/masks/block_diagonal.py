"""Block-diagonal masks over packed sequences whose query and key lengths differ.

Sequence g holds queries q_start[g] <= i < q_start[g] + query_lengths[g] and keys
k_start[g] <= j < k_start[g] + key_lengths[g] (starts are cumulative sums, as flash-attention's
`cu_seqlens_q` / `cu_seqlens_k` and xformers' `BlockDiagonalMask.from_seqlens(q_seqlen,
kv_seqlen)`). Within a sequence, with local positions i' = i - q_start[g], j' = j - k_start[g],
query i sees key j when i' + off - left <= j' <= i' + off + right, off = 0 (top-left, xformers'
`BlockDiagonalCausalMask`) or key_lengths[g] - query_lengths[g] (bottom-right, xformers'
`BlockDiagonalCausalFromBottomRightMask` and flash-attention's varlen causal). Rows and keys past
the last sequence belong to none (padding): they attend, and are attended by, nothing.

Unlike `causal() & document(...)`, which aligns the diagonal on global positions, each block
gets its own diagonal, so cross-attention blocks with L_g != S_g are exact.
"""

from __future__ import annotations

import torch

from attnlab.errors import AttnlabError, check_choice
from attnlab.masks.band import ALIGNS, Band, _reach
from attnlab.masks.sequence import _lengths


class BlockDiagonal(Band):
    """Packed sequences with their own query/key lengths and a per-sequence window."""

    def __init__(self, query_lengths, key_lengths=None, left=None, right=None,
                 align: str = "top_left"):
        self.q_len = _lengths("query_lengths", query_lengths)  # (n,)
        self.k_len = self.q_len if key_lengths is None else _lengths("key_lengths", key_lengths)
        if self.k_len.numel() != self.q_len.numel():
            raise AttnlabError(
                f"key_lengths: {self.k_len.numel()} sequences but query_lengths has "
                f"{self.q_len.numel()}; expected one length of each per sequence"
            )
        self.left, self.right = _reach("left", left), _reach("right", right)
        check_choice("align", align, ALIGNS)
        self.align = align
        for name, t in (("query_lengths", self.q_len), ("key_lengths", self.k_len)):
            total = sum(t.tolist())  # Python ints: a sum past int64 is seen, not wrapped
            if total >= 2**62:
                raise AttnlabError(f"{name}: the sequences hold {total} positions in all, more "
                                   f"than a call can have (2**62)")
        zero = torch.zeros(1, dtype=torch.int64)
        self.q_start = torch.cat([zero, self.q_len.cumsum(0)])  # (n+1,)
        self.k_start = torch.cat([zero, self.k_len.cumsum(0)])
        self._dev: dict = {}  # device -> the tables there (copied once per device)

    def check(self, L, S):
        for name, total, n in (("query_lengths", self.q_start[-1], L),
                               ("key_lengths", self.k_start[-1], S)):
            if int(total) > n:
                raise AttnlabError(
                    f"{name}: the sequences hold {int(total)} positions but the call has {n}")

    def _tables(self, device):
        key = str(device)
        if key not in self._dev:
            off = self.k_len - self.q_len if self.align == "bottom_right" else 0 * self.q_len
            self._dev[key] = tuple(t.to(device) for t in (
                self.q_start, self.k_start, off))
        return self._dev[key]

    def _bounds(self, rows, L, S):
        q_start, k_start, off = self._tables(rows.device)
        n = off.numel()
        g = torch.searchsorted(q_start[1:], rows, right=True)  # (R,): sequence of each row
        inside = g < n
        g = g.clamp(max=max(n - 1, 0))
        at = rows - q_start[g] + k_start[g] + off[g]  # (R,): the key on row i's diagonal
        cap = L + S + 1
        left = cap if self.left is None else min(self.left, cap)
        right = cap if self.right is None else min(self.right, cap)
        lo = torch.maximum(at - left, k_start[g])
        hi = torch.minimum(at + right + 1, k_start[g + 1])
        hi = torch.where(inside, hi, 0)  # a row past the last sequence: nothing
        lo, hi = lo.clamp(0, S), hi.clamp(0, S)
        return lo[None, None], hi[None, None]  # (1, 1, R)

    def __repr__(self):
        return (f"block_diagonal({self.q_len.tolist()}, {self.k_len.tolist()}, left={self.left}, "
                f"right={self.right}, align={self.align!r})")[:300]


def block_diagonal(query_lengths, key_lengths=None, *, left=None, right=None,
                   align: str = "top_left") -> BlockDiagonal:
    """Packed sequences of query_lengths[g] queries and key_lengths[g] keys (default: the same):
    each query sees only its own sequence's keys, within the window [-left, +right] around its
    sequence's diagonal (None = unbounded; align="bottom_right" puts the diagonal at the last
    key of each sequence)."""
    return BlockDiagonal(query_lengths, key_lengths, left, right, align)


def block_causal(query_lengths, key_lengths=None, align: str = "top_left",
                 window: int | None = None) -> BlockDiagonal:
    """Causal attention within each packed sequence, on the sequence's own diagonal:
    xformers' BlockDiagonalCausalMask (top_left), ...FromBottomRightMask and flash-attention's
    varlen causal (bottom_right). `window` keeps the last `window` keys (itself included)."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                               or window < 1):
        raise AttnlabError(f"window: expected a positive int or None, got {window!r}"[:200])
    return BlockDiagonal(query_lengths, key_lengths, None if window is None else window - 1, 0,
                         align)
