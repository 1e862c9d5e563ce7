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

Tile classes are exact, as `create_block_mask` computes them: fn is evaluated on every pair, a
band of query rows at a time (memory bounded by BLOCK_ENTRIES), and each tile reduced to EMPTY /
FULL / PARTIAL. The result is cached per (L, S, block sizes, device), so one mask reused across
layers and steps pays it once. Cost: L·S evaluations of fn on the first use of each shape.

Caution: the cache assumes fn's answer for a given shape never changes; build a new mask when
the tensors fn captures change. `intervals()` returns None (a function is not known to be
interval-shaped without evaluating it everywhere); the interval kernel then does not take it and
the tiled kernel does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.errors import AttnlabError
from attnlab.masks.base import Mask, _size, classify

#: entries of the (Bm, Hm, rows, S) bool block evaluated at a time while classifying tiles
BLOCK_ENTRIES = 1 << 24


class FunctionMask(Mask):
    """A mask given by fn(b, h, q_idx, kv_idx) -> bool; batch_size/heads: how many b and h it
    depends on (1: the same for all, fn sees b = 0 / h = 0)."""

    def __init__(self, fn, batch_size: int = 1, heads: int = 1):
        if not callable(fn):
            raise AttnlabError(f"from_function: expected a callable fn(b, h, q_idx, kv_idx), "
                               f"got {type(fn).__name__}")
        for name, n in (("batch_size", batch_size), ("heads", heads)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise AttnlabError(f"{name}: expected a positive int, got {n!r}"[:200])
        self.fn = fn
        self.batch_size, self.heads = batch_size, heads
        self._tile_cache: dict = {}

    def mask_mod(self, b, h, q_idx, kv_idx):
        """fn itself, in FlexAttention's convention (torch's Flex kernels call this)."""
        return self.fn(b, h, q_idx, kv_idx)

    def _intervals(self, L, S, device):
        """None: a function is not known to be interval-shaped (see the module's Caution)."""
        return None

    def _block(self, rows, cols, L, S):
        dev = rows.device
        b = torch.arange(self.batch_size, device=dev)[:, None, None, None]  # (Bm, 1, 1, 1)
        h = torch.arange(self.heads, device=dev)[None, :, None, None]  # (1, Hm, 1, 1)
        q = rows[None, None, :, None]  # (1, 1, R, 1)
        k = cols[None, None, None, :]  # (1, 1, 1, C)
        out = self.fn(b, h, q, k)
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
            raise AttnlabError(
                f"from_function: fn must return a bool tensor, got "
                f"{getattr(out, 'dtype', type(out).__name__)}")
        try:
            return out.expand(self.batch_size, self.heads, len(rows), len(cols))
        except RuntimeError:
            raise AttnlabError(
                f"from_function: fn returned shape {tuple(out.shape)}, which does not broadcast "
                f"to (Bm, Hm, R, C) = ({self.batch_size}, {self.heads}, {len(rows)}, "
                f"{len(cols)})") from None

    def tiles(self, L, S, block_q, block_k, device=None):
        dev = torch.device("cpu") if device is None else torch.device(device)
        key = (L, S, block_q, block_k, str(dev))  # the block sizes known without a sync
        if key not in self._tile_cache:
            L, S = _size("L", L), _size("S", S)
            bq, bk = _size("block_q", block_q, 1), _size("block_k", block_k, 1)
            self._tile_cache[key] = self._classes_sized(L, S, bq, bk, dev)
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

    def _classes_sized(self, L, S, bq, bk, dev):
        """Exact classes (Bm, Hm, ceil(L/bq), ceil(S/bk)): fn on bands of whole query blocks,
        each reduced by padding to whole tiles and reshaping (the fast form, sizes known)."""
        nq, nk = -(-L // bq), -(-S // bk)
        out = torch.empty(self.batch_size, self.heads, nq, nk, dtype=torch.int8, device=dev)
        per_band = max(1, BLOCK_ENTRIES // max(1, self.batch_size * self.heads * S * bq))
        cols = torch.arange(S, device=dev)
        for t0 in range(0, nq, per_band):  # whole query blocks at a time
            t1 = min(nq, t0 + per_band)
            r0, r1 = t0 * bq, min(L, t1 * bq)
            m = self.block(torch.arange(r0, r1, device=dev), cols, L, S)  # (Bm, Hm, r, S)
            pad = (0, nk * bk - S, 0, (t1 - t0) * bq - (r1 - r0))
            shape = (self.batch_size, self.heads, t1 - t0, bq, nk, bk)
            any_ = F.pad(m, pad, value=False).reshape(shape).any(-1).any(-2)
            all_ = F.pad(m, pad, value=True).reshape(shape).all(-1).all(-2)
            out[:, :, t0:t1] = classify(all_, ~any_)
        return out

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
        return f"from_function({name}, batch_size={self.batch_size}, heads={self.heads})"


def from_function(fn, batch_size: int = 1, heads: int = 1) -> FunctionMask:
    """A mask from fn(b, h, q_idx, kv_idx) -> bool tensor (True = may attend), FlexAttention's
    mask_mod convention; pass batch_size / heads when fn depends on b / h (as create_block_mask's
    B and H). Composes with & | ~ and every built-in mask."""
    return FunctionMask(fn, batch_size, heads)

