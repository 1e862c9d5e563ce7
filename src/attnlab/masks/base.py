"""The Mask protocol and its combinators (&, |, ~).

A mask says which (query i, key j) pairs may attend: True = may attend, as in SDPA's bool masks.
Every mask can

- evaluate any block of rows and columns (`block`), which is all a kernel needs for one tile;
- build the whole bool matrix (`to_dense`), shape (Bm, Hm, L, S) with Bm, Hm in {1, B}, {1, H};
- classify each (query-block, key-block) tile as EMPTY, FULL or PARTIAL (`tiles`) from interval
  arithmetic, without building the L×S matrix, so a tiled kernel can skip empty tiles and do no mask
  work on full ones.

Caution: tile classes of `&`, `|` are conservative: a tile they call PARTIAL may turn out empty or
full when evaluated; EMPTY and FULL are always exact.
"""

from __future__ import annotations

import operator
import weakref

import torch

EMPTY, PARTIAL, FULL = 0, 1, 2


def block_bounds(n: int, size: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """First and last (inclusive) index of each block of `size` covering range(n)."""
    lo = torch.arange(0, n, size, device=device)
    hi = torch.clamp(lo + size - 1, max=n - 1)
    return lo, hi


def classify(full: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
    """int8 tile classes from two bool tensors of the same shape (`empty` wins a tie; none arises
    from exact classes). torch.where, not boolean indexing: no host sync on a device."""
    kind = lambda c: torch.tensor(c, dtype=torch.int8, device=full.device)  # noqa: E731
    return torch.where(empty, kind(EMPTY), torch.where(full, kind(FULL), kind(PARTIAL)))


def as_4d(x: torch.Tensor) -> torch.Tensor:
    """Give a (..., L, S)-like tensor exactly 4 dims (Bm, Hm, ., .) by adding leading 1s."""
    while x.dim() < 4:
        x = x.unsqueeze(0)
    return x


class Mask:
    """Base class of structured masks. Subclasses implement `_block` and `_tiles`."""

    #: size of the batch dim this mask depends on (1 = same for every batch element)
    batch_size: int = 1
    #: number of heads this mask depends on (1 = same for every head)
    heads: int = 1

    # -- what subclasses implement -------------------------------------------------------------
    def _block(self, rows: torch.Tensor, cols: torch.Tensor, L: int, S: int) -> torch.Tensor:
        """bool (Bm|1, Hm|1, len(rows), len(cols)) for these row and column indices."""
        raise NotImplementedError

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, L: int, S: int) -> torch.Tensor:
        """int8 classes, broadcastable to (Bm, Hm, nQ, nK); q_* are (nQ, 1), k_* are (1, nK)."""
        raise NotImplementedError

    def check(self, L: int, S: int) -> None:
        """Raise AttnlabError if this mask cannot describe an L×S score matrix."""

    # -- what kernels ask a mask about itself --------------------------------------------------
    @property
    def shift_invariant(self) -> bool:
        """The mask at (i, j) depends on i - j only, so equal diagonal offsets share a mask."""
        return False

    @property
    def is_top_left_causal(self) -> bool:
        """Exactly SDPA's `is_causal=True` (query i sees keys j <= i) at every L, S."""
        return False

    def for_call(self, B: int, H: int) -> Mask:
        """This mask as a call with B batch elements (the last batch dim) and H heads evaluates
        it: itself, unless a part of it (a mask function reading b or h) takes its batch or
        heads from the call. Kept per (B, H), so the caches of the result serve every call."""
        return self

    def mask_mod(self, L: int, S: int, device=None):
        """This mask as FlexAttention's mask_mod(b, h, q_idx, kv_idx) -> bool for an L×S call on
        `device`. Compiled Flex lowers it into its kernel, so it is pointwise: arithmetic on the
        indices (scalars there, broadcast tensors here) and loads from captured tensors, no
        reshapes or searches. This default loads the row's key interval when the mask has them,
        else the mask materialised once on the device (L×S bools); kinds override it."""
        iv = self.intervals(L, S, device=device)
        if iv is not None:
            lo, hi = iv  # (Bm|1, Hm|1, L) int32
            pb, ph = pick(lo.shape[0]), pick(lo.shape[1])
            return lambda b, h, q, k: (k >= lo[pb(b), ph(h), q]) & (k < hi[pb(b), ph(h), q])
        t = self.to_dense(L, S, device)  # (Bm, Hm, L, S)
        pb, ph = pick(t.shape[0]), pick(t.shape[1])
        return lambda b, h, q, k: t[pb(b), ph(h), q, k]

    def simplified(self, L: int, S: int) -> Mask | None:
        """An equal, simpler mask for an L×S score matrix; None when it allows every pair."""
        return self

    def _intervals(self, L: int, S: int, device):
        """(lo, hi) int64 broadcastable to (Bm, Hm, L) when every row's keys form one interval
        lo <= j < hi, else None. Subclasses that are interval-shaped override this."""
        return None

    # -- public API ----------------------------------------------------------------------------
    def block(self, rows, cols, L: int, S: int) -> torch.Tensor:
        """bool (Bm, Hm, len(rows), len(cols)): the mask at these query rows and key columns."""
        out = as_4d(self._block(rows, cols, L, S))
        return out.expand(self.batch_size, self.heads, len(rows), len(cols))

    def to_dense(self, L: int, S: int, device=None) -> torch.Tensor:
        """bool (Bm, Hm, L, S): True where query i may attend to key j."""
        L, S = _size("L", L), _size("S", S)
        self.check(L, S)
        rows = torch.arange(L, device=device)
        cols = torch.arange(S, device=device)
        return self.block(rows, cols, L, S)

    def intervals(self, L: int, S: int, device=None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Per-row key intervals: int32 (lo, hi) of shape (Bm, Hm, L) with Bm, Hm in {1, B},
        {1, H}, such that query i may attend key j exactly when lo <= j < hi; an empty row has
        lo = hi = 0. None when some row's keys are not one interval. O(L), no L×S matrix.

        Computed once per (L, S, device) and kept with the mask for its SIZES_KEPT latest sizes
        (a forward, its backward and its weights ask for the same; up to KEPT_ROWS rows): a mask
        is a value, its tensors are not changed after it is built, and the result is not to be
        written to."""
        L, S = _size("L", L), _size("S", S)
        return self._kept((L, S, None if device is None else str(torch.device(device))),
                          lambda: self._compute_intervals(L, S, device))

    def intervals_copied(self, L: int, S: int, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`intervals(L, S)` computed on the host and copied to `device`, once, kept the same
        way: for a device call (some kinds find their intervals with searches that would sync
        a device)."""
        L, S = _size("L", L), _size("S", S)

        def copy():
            got = self.intervals(L, S)
            return None if got is None else tuple(x.to(device) for x in got)

        return self._kept((L, S, f"copied to {torch.device(device)}"), copy)

    def _compute_intervals(self, L: int, S: int, device):
        self.check(L, S)
        got = self._intervals(L, S, device)
        if got is None:
            return None
        lo, hi = (torch.as_tensor(x, device=device).clamp(0, S) for x in got)
        lo, hi = torch.broadcast_tensors(_rows3(lo, L), _rows3(hi, L))
        live = lo < hi
        lo, hi = torch.where(live, lo, 0), torch.where(live, hi, 0)
        return lo.to(torch.int32).contiguous(), hi.to(torch.int32).contiguous()

    def _kept(self, key, compute):
        """compute() once per key, kept with the mask (the SIZES_KEPT latest keys, results of
        at most KEPT_ROWS rows; larger ones are recomputed, O(L))."""
        per = _INTERVALS.setdefault(self, {})
        if key in per:
            return per[key]
        got = compute()
        if got is None or got[0].numel() <= KEPT_ROWS:
            per[key] = got
        while len(per) > SIZES_KEPT:  # a loop over growing lengths keeps only the latest
            del per[next(iter(per))]
        return got

    def tiles(self, L: int, S: int, block_q: int, block_k: int, device=None) -> torch.Tensor:
        """int8 (Bm, Hm, ceil(L/block_q), ceil(S/block_k)): EMPTY=0, PARTIAL=1, FULL=2 per tile."""
        L, S = _size("L", L), _size("S", S)
        block_q, block_k = _size("block_q", block_q, 1), _size("block_k", block_k, 1)
        q_lo, q_hi = block_bounds(L, block_q, device)
        k_lo, k_hi = block_bounds(S, block_k, device)
        t = as_4d(self._tiles(q_lo[:, None], q_hi[:, None], k_lo[None, :], k_hi[None, :], L, S))
        return t.expand(self.batch_size, self.heads, len(q_lo), len(k_lo))

    def __and__(self, other: Mask) -> Mask:
        return And(self, _as_mask(other))

    def __or__(self, other: Mask) -> Mask:
        return Or(self, _as_mask(other))

    def __invert__(self) -> Mask:
        return Not(self)


#: per mask: its intervals by (L, S, device) (and host copies by device), the SIZES_KEPT latest,
#: living as long as the mask;
#: only those of at most KEPT_ROWS rows (16 MiB: a padding mask over 64 sequences of 32k tokens)
_INTERVALS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
SIZES_KEPT = 4
KEPT_ROWS = 1 << 21


def pick(n: int):
    """The index into a dim of size n: the batch/head index itself, or 0 when the dim is
    broadcast (size 1)."""
    return (lambda i: i) if n > 1 else (lambda i: 0)


def _for_call(m: Mask, B: int, H: int, parts: tuple, make) -> Mask:
    """A combinator's for_call: itself when no part changes, else make(*new parts), kept."""
    got = tuple(p.for_call(B, H) for p in parts)
    if all(a is b for a, b in zip(got, parts)):
        return m
    per = _FOR_CALL.setdefault(m, {})
    if (B, H) not in per:
        per[(B, H)] = make(*got)
    return per[(B, H)]


#: per combinator: its masks for (B, H), living as long as it
_FOR_CALL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _rows3(x: torch.Tensor, L: int) -> torch.Tensor:
    """A per-row tensor as (Bm|1, Hm|1, L): leading 1s added, a broadcast row dim expanded."""
    while x.dim() < 3:
        x = x.unsqueeze(0)
    return x.expand(*x.shape[:-1], L)


def _size(name: str, n, least: int = 0) -> int:
    """n as an int >= least, or AttnlabError naming the argument."""
    try:
        v = None if isinstance(n, bool) else operator.index(n)
    except TypeError:
        v = None
    if v is None or not least <= v < 2**63:
        from attnlab.errors import AttnlabError

        kind = "a positive int" if least == 1 else "an int >= 0"
        raise AttnlabError(f"{name}: expected {kind}, got {n!r}"[:200])
    return v


def _as_mask(x) -> Mask:
    if isinstance(x, Mask):
        return x
    from attnlab.errors import AttnlabError

    raise AttnlabError(f"mask: can only combine with another attnlab mask, got {type(x).__name__}")


def _joint_size(a: int, b: int, what: str) -> int:
    if a != b and 1 not in (a, b):
        from attnlab.errors import AttnlabError

        raise AttnlabError(f"mask: cannot combine masks over {a} and {b} {what}")
    return max(a, b)


class _Binary(Mask):
    op = "?"

    def __init__(self, a: Mask, b: Mask):
        self.a, self.b = a, b
        self.batch_size = _joint_size(a.batch_size, b.batch_size, "batch elements")
        self.heads = _joint_size(a.heads, b.heads, "heads")

    def check(self, L, S):
        self.a.check(L, S)
        self.b.check(L, S)

    def for_call(self, B, H):
        return _for_call(self, B, H, (self.a, self.b), type(self))

    @property
    def shift_invariant(self) -> bool:
        return self.a.shift_invariant and self.b.shift_invariant

    def __repr__(self):
        return f"({self.a!r} {self.op} {self.b!r})"


class And(_Binary):
    op = "&"

    def _intervals(self, L, S, device):
        return _and_intervals(self, L, S, device)

    def mask_mod(self, L, S, device=None):
        a, b = self.a.mask_mod(L, S, device), self.b.mask_mod(L, S, device)
        return lambda bi, h, q, k: a(bi, h, q, k) & b(bi, h, q, k)

    def _block(self, rows, cols, L, S):
        return as_4d(self.a._block(rows, cols, L, S)) & as_4d(self.b._block(rows, cols, L, S))

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, L, S):
        ta = as_4d(self.a._tiles(q_lo, q_hi, k_lo, k_hi, L, S))
        tb = as_4d(self.b._tiles(q_lo, q_hi, k_lo, k_hi, L, S))
        return classify((ta == FULL) & (tb == FULL), (ta == EMPTY) | (tb == EMPTY))


def _both_intervals(m: _Binary, L, S, device):
    a = m.a._intervals(L, S, device)
    b = None if a is None else m.b._intervals(L, S, device)
    return None if b is None else (a, b)


def _and_intervals(self: _Binary, L, S, device):
    got = _both_intervals(self, L, S, device)
    if got is None:
        return None
    (lo_a, hi_a), (lo_b, hi_b) = got
    return torch.maximum(_rows3(lo_a, L), _rows3(lo_b, L)), torch.minimum(
        _rows3(hi_a, L), _rows3(hi_b, L))


def _or_intervals(self: _Binary, L, S, device):
    """The union of two intervals is one where they overlap or touch, or one is empty."""
    got = _both_intervals(self, L, S, device)
    if got is None:
        return None
    (lo_a, hi_a), (lo_b, hi_b) = ((_rows3(x, L).clamp(0, S) for x in p) for p in got)
    lo_a, hi_a, lo_b, hi_b = torch.broadcast_tensors(lo_a, hi_a, lo_b, hi_b)
    ea, eb = lo_a >= hi_a, lo_b >= hi_b
    if not bool((ea | eb | (torch.maximum(lo_a, lo_b) <= torch.minimum(hi_a, hi_b))).all()):
        return None
    lo = torch.where(ea, lo_b, torch.where(eb, lo_a, torch.minimum(lo_a, lo_b)))
    hi = torch.where(ea, hi_b, torch.where(eb, hi_a, torch.maximum(hi_a, hi_b)))
    return lo, hi



class Or(_Binary):
    op = "|"

    def _intervals(self, L, S, device):
        return _or_intervals(self, L, S, device)

    def mask_mod(self, L, S, device=None):
        a, b = self.a.mask_mod(L, S, device), self.b.mask_mod(L, S, device)
        return lambda bi, h, q, k: a(bi, h, q, k) | b(bi, h, q, k)

    def _block(self, rows, cols, L, S):
        return as_4d(self.a._block(rows, cols, L, S)) | as_4d(self.b._block(rows, cols, L, S))

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, L, S):
        ta = as_4d(self.a._tiles(q_lo, q_hi, k_lo, k_hi, L, S))
        tb = as_4d(self.b._tiles(q_lo, q_hi, k_lo, k_hi, L, S))
        return classify((ta == FULL) | (tb == FULL), (ta == EMPTY) & (tb == EMPTY))



class Not(Mask):
    def __init__(self, a: Mask):
        self.a = a
        self.batch_size, self.heads = a.batch_size, a.heads

    def check(self, L, S):
        self.a.check(L, S)

    def for_call(self, B, H):
        return _for_call(self, B, H, (self.a,), Not)

    def mask_mod(self, L, S, device=None):
        a = self.a.mask_mod(L, S, device)
        return lambda b, h, q, k: ~a(b, h, q, k)

    @property
    def shift_invariant(self) -> bool:
        return self.a.shift_invariant

    def _block(self, rows, cols, L, S):
        return ~self.a._block(rows, cols, L, S)

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, L, S):
        t = self.a._tiles(q_lo, q_hi, k_lo, k_hi, L, S)
        return (FULL - t).to(torch.int8)  # EMPTY <-> FULL, PARTIAL stays

    def __repr__(self):
        return f"~{self.a!r}"
