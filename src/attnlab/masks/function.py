"""from_function: a mask written as one Python function, FlexAttention's `mask_mod` convention.

    def sliding(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx >= 0) & (q_idx - kv_idx < 256)
    m = masks.from_function(sliding) & masks.padding(key_lengths=lens)

`fn(b, h, q_idx, kv_idx) -> bool tensor` is called on broadcast index tensors, b (Bm, 1, 1, 1),
h (1, Hm, 1, 1), q_idx (1, 1, R, 1), kv_idx (1, 1, 1, C) (int64, on the call's device), and must
return a bool tensor broadcastable to (Bm, Hm, R, C): write it with elementwise tensor ops
(&, |, ~, comparisons, indexing captured tensors by the indices), never Python `if`/`and` on
tensors, which is also what torch's FlexAttention requires (it calls the same function on scalars
under vmap, so one function serves both).

Batch and heads: whether fn reads `b` or `h` is found from the shape it returns on broadcast
indices (b of 2 rows, h of 2 columns); an attention call then evaluates it at every batch
element and head of the call (`for_call(B, H)`), never at b = h = 0 only. Outside a call, such a
mask needs batch_size= / heads= (as create_block_mask's B and H).

One evaluation: fn runs on every pair once per (L, S, device), a band of query rows at a time
(memory bounded by BLOCK_ENTRIES), and that pass gives both the exact tile classes (as
`create_block_mask` computes them) and, per row, whether its keys form one interval. When every
row's do, the mask is interval-shaped: `intervals()` returns them, so the compiled interval kernel
runs it like a built-in window, and later tile classes come from the intervals without calling fn
again. Cost: L·S evaluations of fn on the first use of each shape.

Caution: the results are cached with the mask, so they assume fn's answer for a given shape never
changes; build a new mask when the tensors fn captures change (or capture copies).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from attnlab.errors import AttnlabError
from attnlab.flexfn import adapt
from attnlab.masks.base import Mask, _size, block_bounds, classify

#: entries of the (Bm, Hm, rows, S) bool block evaluated at a time while classifying tiles
BLOCK_ENTRIES = 1 << 24
#: the tile the first evaluation classifies besides the intervals: the tiled kernel's
#: (BLOCK_Q, BLOCK_K), so a mask that is not interval-shaped is evaluated once there too
FIRST_TILES = (128, 64)


class FunctionMask(Mask):
    """A mask given by fn(b, h, q_idx, kv_idx) -> bool; batch_size/heads: how many b and h it
    covers (None: found from the call when fn reads them, else 1)."""

    def __init__(self, fn, batch_size: int | None = None, heads: int | None = None):
        if not callable(fn):
            raise AttnlabError(f"from_function: expected a callable fn(b, h, q_idx, kv_idx), "
                               f"got {type(fn).__name__}")
        for name, n in (("batch_size", batch_size), ("heads", heads)):
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                raise AttnlabError(f"{name}: expected a positive int or None, got {n!r}"[:200])
        self.fn = fn
        #: fn called as Flex's answer needs it: broadcast, or vmap for scalar-only functions
        self._adapted = adapt(fn, score=False)
        self.given = (batch_size, heads)
        self.batch_size, self.heads = batch_size or 1, heads or 1
        self._tile_cache: dict = {}
        self._reads: dict = {}  # device -> (reads b, reads h)
        self._calls: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    # -- batch and heads from the call ---------------------------------------------------------
    def reads(self, device=None) -> tuple[bool, bool]:
        """(fn reads b, fn reads h): found once from the shape fn returns on broadcast indices
        b (2, 1, 1, 1), h (1, 2, 1, 1) (zeros, so any table indexed by them is in range)."""
        key = str(torch.device("cpu") if device is None else torch.device(device))
        if key not in self._reads:
            z = lambda *s: torch.zeros(*s, dtype=torch.int64, device=device)  # noqa: E731
            out = self._call_fn(z(2, 1, 1, 1), z(1, 2, 1, 1), z(1, 1, 1, 1), z(1, 1, 1, 1))
            if out.dim() > 4:
                raise AttnlabError(f"from_function: fn returned shape {tuple(out.shape)}, which "
                                   f"does not broadcast to (Bm, Hm, R, C)")
            shape = (1,) * (4 - out.dim()) + tuple(out.shape)
            self._reads[key] = (shape[0] > 1, shape[1] > 1)
        return self._reads[key]

    def for_call(self, B: int, H: int) -> Mask:
        """This mask as a call with B batch elements and H heads evaluates it: fn at every b < B
        it reads, every h < H (one mask per (B, H), kept, so its caches serve every such call)."""
        rb, rh = self.reads()
        gb, gh = self.given
        for name, reads, given, n in (("batch_size", rb, gb, B), ("heads", rh, gh, H)):
            if reads and given is not None and given != n:
                raise AttnlabError(
                    f"from_function: fn reads {'b' if name == 'batch_size' else 'h'}, and "
                    f"{name}={given} but the call has {n}; pass {name}={n} or leave it None")
        want = (gb if gb is not None else (B if rb else 1),
                gh if gh is not None else (H if rh else 1))
        if (gb is not None or not rb) and (gh is not None or not rh):
            return self  # sized already, or fn reads neither
        got = self._calls.get(want)
        if got is None:
            got = FunctionMask(self.fn, *want)
            got._adapted = self._adapted  # one form decision per shape for all of them
            got._reads = self._reads
            self._calls[want] = got
            self._tile_cache[("for_call", want)] = got  # kept as long as this mask
        return got

    def _unsized(self, device) -> None:
        """AttnlabError when fn reads b or h but this mask does not know how many there are."""
        rb, rh = self.reads(device)
        gb, gh = self.given
        if (rb and gb is None and self.batch_size == 1) or (rh and gh is None and self.heads == 1):
            what = " and ".join(n for n, r in (("b", rb and gb is None), ("h", rh and gh is None))
                                if r)
            raise AttnlabError(
                f"from_function: fn reads {what}; pass batch_size= / heads= to evaluate it "
                f"outside an attention call (a call evaluates it at its own B and H)")

    # -- evaluation ----------------------------------------------------------------------------
    def _call_fn(self, b, h, q, k) -> torch.Tensor:
        out = self._adapted(b, h, q, k)
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
            raise AttnlabError(
                f"from_function: fn must return a bool tensor, got "
                f"{getattr(out, 'dtype', type(out).__name__)}")
        return out

    def mask_mod(self, L: int, S: int, device=None):
        """fn itself: FlexAttention calls it with the kernel's own b, h, q_idx, kv_idx."""
        return self.fn

    def _block(self, rows, cols, L, S):
        dev = rows.device
        if (self.batch_size, self.heads) == (1, 1):
            self._unsized(dev)
        b = torch.arange(self.batch_size, device=dev)[:, None, None, None]  # (Bm, 1, 1, 1)
        h = torch.arange(self.heads, device=dev)[None, :, None, None]  # (1, Hm, 1, 1)
        q = rows[None, None, :, None]  # (1, 1, R, 1)
        k = cols[None, None, None, :]  # (1, 1, 1, C)
        out = self._call_fn(b, h, q, k)
        try:
            return out.expand(self.batch_size, self.heads, len(rows), len(cols))
        except RuntimeError:
            raise AttnlabError(
                f"from_function: fn returned shape {tuple(out.shape)}, which does not broadcast "
                f"to (Bm, Hm, R, C) = ({self.batch_size}, {self.heads}, {len(rows)}, "
                f"{len(cols)})") from None

    def _intervals(self, L, S, device):
        """The rows' key intervals when every row's keys are one interval (found in the one
        evaluation of fn, `_evaluate`), else None; None on an accelerator, where finding them
        would read a flag back to the host (and no interval kernel runs there)."""
        dev = torch.device("cpu") if device is None else torch.device(device)
        return self._evaluate(L, S, dev)["intervals"] if dev.type == "cpu" else None

    def intervals_copied(self, L, S, device):
        """None: fn may read tensors that live on `device`, so it is not evaluated on the host."""
        return None

    def tiles(self, L, S, block_q, block_k, device=None):
        dev = torch.device("cpu") if device is None else torch.device(device)
        L, S = _size("L", L), _size("S", S)
        bq, bk = _size("block_q", block_q, 1), _size("block_k", block_k, 1)
        key = (L, S, bq, bk, str(dev))  # the block sizes known without a sync
        if key not in self._tile_cache:
            ev = self._evaluate(L, S, dev, (bq, bk))
            if key not in self._tile_cache:  # not classified in that pass: from the intervals
                lo, hi = ev["intervals"]
                k_lo, k_hi = block_bounds(S, bk, dev)
                self._tile_cache[key] = self._band_tiles(lo, hi, bq, k_lo, k_hi)
        return self._tile_cache[key]

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, L, S):
        if q_lo.device.type != "cpu":  # inside `&`/`|` on a device: no sync to read block sizes
            return self._classes(L, S, q_lo[:, 0], k_lo[0])
        bq = int(q_hi[0, 0] - q_lo[0, 0]) + 1 if q_lo.numel() else 1
        bk = int(k_hi[0, 0] - k_lo[0, 0]) + 1 if k_lo.numel() else 1
        return self.tiles(L, S, bq, bk, q_lo.device)  # cached, also for `&`/`|`

    def memo(self, key) -> dict:
        """A store kernels may keep data derived from this mask in (e.g. chunk masks), keyed by
        what they derive it for; it lives as long as the mask, like the tile classes."""
        return self._tile_cache.setdefault(("memo", key), {})

    def _evaluate(self, L, S, dev, blocks=None) -> dict:
        """The one pass of fn over every pair for (L, S, dev): {"intervals": (lo, hi) int64
        (Bm, Hm, L) or None}, and the tile classes at `blocks` (default FIRST_TILES) stored in
        the tile cache. A later call with other block sizes classifies from the intervals when
        there are some, else evaluates fn again for those tiles only."""
        key = ("evaluated", L, S, str(dev))
        got = self._tile_cache.get(key)
        if got is not None and (blocks is None or got["intervals"] is not None):
            return got
        bq, bk = blocks or FIRST_TILES
        self._tile_cache[(L, S, bq, bk, str(dev))], iv = self._classes_sized(L, S, bq, bk, dev)
        if got is None:
            got = self._tile_cache[key] = {"intervals": iv}
        return got

    def _classes_sized(self, L, S, bq, bk, dev):
        """(exact classes (Bm, Hm, ceil(L/bq), ceil(S/bk)), intervals or None): fn on bands of
        whole query blocks. On the host each band is first reduced per row to its first and last
        key and whether a key between them is left out (`_row_interval`); while every row so far is
        one interval, the band's tiles are left to `band_tiles` of the intervals (exact, O(rows
        + tiles)); from the first band with a gap on (and on a device), each band is reduced to
        whole tiles by padding and reshaping."""
        nq, nk = -(-L // bq), -(-S // bk)
        Bm, Hm = self.batch_size, self.heads
        out = torch.empty(Bm, Hm, nq, nk, dtype=torch.int8, device=dev)
        rows = L if dev.type == "cpu" else 0  # intervals are looked for on the host only
        lo = torch.zeros(Bm, Hm, rows, dtype=torch.int64, device=dev)
        hi = torch.zeros_like(lo)
        one = dev.type == "cpu" and S > 0  # every row so far one interval
        per_band = max(1, BLOCK_ENTRIES // max(1, Bm * Hm * S * bq))
        cols = torch.arange(S, device=dev)
        k_lo, k_hi = block_bounds(S, bk, dev)
        for t0 in range(0, nq, per_band):  # whole query blocks at a time
            t1 = min(nq, t0 + per_band)
            r0, r1 = t0 * bq, min(L, t1 * bq)
            m = self.block(torch.arange(r0, r1, device=dev), cols, L, S)  # (Bm, Hm, r, S)
            if one:
                first, last, ok = _row_interval(m, cols)  # (Bm, Hm, r) each
                lo[:, :, r0:r1], hi[:, :, r0:r1] = first, last
                if bool(ok.all()):
                    continue  # this band's tiles come from its intervals, below
                one = False  # a gap: the earlier bands' tiles from their intervals, now
                out[:, :, :t0] = self._band_tiles(lo[:, :, :r0], hi[:, :, :r0], bq, k_lo, k_hi)
            pad = (0, nk * bk - S, 0, (t1 - t0) * bq - (r1 - r0))
            shape = (Bm, Hm, t1 - t0, bq, nk, bk)
            any_ = F.pad(m, pad, value=False).reshape(shape).any(-1).any(-2)
            all_ = F.pad(m, pad, value=True).reshape(shape).all(-1).all(-2)
            out[:, :, t0:t1] = classify(all_, ~any_)
        if one:
            return self._band_tiles(lo, hi, bq, k_lo, k_hi), (lo, hi)
        return out, None

    def _band_tiles(self, lo, hi, bq, k_lo, k_hi):
        """Exact classes of the query blocks of rows [0, lo.shape[-1]) from their intervals."""
        from attnlab.masks.band import band_tiles

        q_first = torch.arange(0, lo.shape[-1], bq, device=lo.device)
        return band_tiles(lo, hi, q_first, k_lo, k_hi)

    def _classes(self, L, S, q_first, k_first):
        """Exact classes (Bm, Hm, nQ, nK) of tiles starting at q_first (nQ,) × k_first (nK,):
        fn on a band of rows at a time, reduced into tiles by block ids (searchsorted), so no
        block size (and no host sync) is needed."""
        dev, n = q_first.device, self.batch_size * self.heads
        nq, nk = q_first.numel(), k_first.numel()
        hit = torch.zeros(n, nq, nk, dtype=torch.uint8, device=dev)  # some pair attends
        every = torch.ones(n, nq, nk, dtype=torch.uint8, device=dev)  # every pair attends
        if nq == 0 or nk == 0:
            return classify(every.bool(), hit == 0).reshape(self.batch_size, self.heads, nq, nk)
        cols = torch.arange(S, device=dev)
        k_blk = torch.searchsorted(k_first, cols, right=True) - 1  # (S,): key block of each col
        band = max(1, BLOCK_ENTRIES // max(1, n * S))
        for r0 in range(0, L, band):
            rows = torch.arange(r0, min(L, r0 + band), device=dev)
            R = rows.numel()
            m = self.block(rows, cols, L, S).reshape(n, R, S).to(torch.uint8)  # (Bm·Hm, R, S)
            idx = k_blk.expand(n, R, S)
            c_hit = m.new_zeros(n, R, nk).scatter_reduce_(2, idx, m, "amax")  # (Bm·Hm, R, nK)
            c_all = m.new_ones(n, R, nk).scatter_reduce_(2, idx, m, "amin")
            q_blk = (torch.searchsorted(q_first, rows, right=True) - 1)[None, :, None]
            q_idx = q_blk.expand(n, R, nk)  # (Bm·Hm, R, nK): query block of each row
            hit.scatter_reduce_(1, q_idx, c_hit, "amax")
            every.scatter_reduce_(1, q_idx, c_all, "amin")
        out = classify(every.bool(), hit == 0)  # (Bm·Hm, nQ, nK)
        return out.reshape(self.batch_size, self.heads, nq, nk)

    def __repr__(self):
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        return f"from_function({name}, batch_size={self.given[0]}, heads={self.given[1]})"


def _row_interval(m: torch.Tensor, cols: torch.Tensor):
    """(lo, hi, ok) of bool rows m (..., r, S): each row's first key attended and one past its
    last (0, 0 for a row with none), and whether every key between them is attended (the row is
    one interval). Argmax passes, no count: the first key not attended at or after lo must lie
    at or past hi."""
    u = m.view(torch.uint8)
    first = u.argmax(-1)  # (..., r): the first key attended (0 if none)
    live = m.gather(-1, first[..., None])[..., 0]
    last = m.shape[-1] - u.flip(-1).argmax(-1)  # one past the last attended
    g = m | (cols < first[..., None])  # (..., r, S): False only at keys past lo not attended
    z = g.view(torch.uint8).argmin(-1)  # the first of them (0, and g there True, if none)
    ok = ~live | g.gather(-1, z[..., None])[..., 0] | (z >= last)
    return torch.where(live, first, 0), torch.where(live, last, 0), ok


def from_function(fn, batch_size: int | None = None, heads: int | None = None) -> FunctionMask:
    """A mask from fn(b, h, q_idx, kv_idx) -> bool tensor (True = may attend), FlexAttention's
    mask_mod convention. When fn reads b or h, an attention call evaluates it at its own batch
    and heads; batch_size / heads (as create_block_mask's B and H) fix them for use outside a
    call. Composes with & | ~ and every built-in mask."""
    return FunctionMask(fn, batch_size, heads)
