"""The global picture every rank computes for itself: where tokens live, which (query, key) pieces
the mask leaves anything in, and which key rows each rank needs from each other rank.

All of it comes from the mask's tile classes on global positions, so every rank derives the same
answer with no communication, and the cost model (`plan`) uses the very same numbers.

Caution: tile classes of combined masks (`&`, `|`) are conservative (a PARTIAL tile may turn out
empty), and so is everything derived here: a transfer may carry a key that, evaluated exactly,
no query attends; it never misses one that some query does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import torch

from attnlab.distributed.layouts import Piece, Sharding
from attnlab.masks import EMPTY, FULL, PARTIAL, Mask

#: key-side granularity of transfer planning: at most this many key blocks over the sequence
MAX_KEY_BLOCKS = 4096


@dataclass
class Geometry:
    """L queries and S keys split over `world` ranks in `layout`, under `mask` (None: all)."""

    L: int
    S: int
    world: int
    layout: str
    mask: Mask | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    @cached_property
    def q(self) -> Sharding:
        return Sharding(self.L, self.layout, self.world)

    @cached_property
    def k(self) -> Sharding:
        return Sharding(self.S, self.layout, self.world)

    # -- piece pairs: what a rank computes -------------------------------------------------------
    @cached_property
    def chunk_classes(self) -> torch.Tensor | None:
        """int8 (nQchunks, nKchunks): EMPTY / FULL only when so for every batch and head."""
        if self.mask is None or self.layout == "striped":
            return None
        t = self.mask.tiles(self.L, self.S, self.q.chunk, self.k.chunk)  # (Bm, Hm, nQ, nK)
        return _reduce_classes(t)

    def pair_class(self, qp: Piece, kp: Piece) -> int:
        """EMPTY, PARTIAL or FULL for a (query piece, key piece) pair, from tiles where it can."""
        if self.mask is None:
            return FULL
        cc = self.chunk_classes
        if cc is None or qp.chunk is None or kp.chunk is None:
            return PARTIAL
        return int(cc[qp.chunk, kp.chunk])

    # -- key needs: what a rank receives ---------------------------------------------------------
    @cached_property
    def key_block(self) -> int:
        """Keys per block of transfer planning: 1 (exact) up to MAX_KEY_BLOCKS blocks, else the
        largest divisor of the chunk that keeps the block count near that bound (so blocks
        never straddle two ranks' chunks)."""
        target = math.ceil(self.S / MAX_KEY_BLOCKS)
        if target <= 1 or self.layout == "striped":
            return max(1, target)
        c = self.k.chunk
        return max(d for d in range(1, min(c, target) + 1) if c % d == 0)

    @cached_property
    def need_blocks(self) -> torch.Tensor:
        """bool (world, nKb): rank r has a query that may attend some key of key block b."""
        P, bk = self.world, self.key_block
        nkb = math.ceil(self.S / bk)
        has_rows = torch.tensor([self.q.size(r) > 0 for r in range(P)])
        if self.mask is None:
            return has_rows[:, None].expand(P, nkb).clone()
        bq = self.q.chunk if self.layout != "striped" else max(1, math.ceil(self.L / (2 * P)))
        t = self.mask.tiles(self.L, self.S, bq, bk)  # (Bm, Hm, nQ, nKb)
        live = (t != EMPTY).flatten(0, 1).any(0)  # (nQ, nKb)
        if self.layout == "striped":  # every rank has rows in every query block
            return has_rows[:, None] & live.any(0)[None, :]
        need = torch.zeros(P, nkb, dtype=torch.bool)
        for r in range(P):
            rows = [c for c in self.q.chunks_of(r) if c < live.shape[0]]
            if rows:
                need[r] = live[rows].any(0)
        return need

    def rows_needed(self, r: int, s: int) -> torch.Tensor:
        """int64 local row indices of rank s's keys that rank r needs."""
        key = ("rows", r, s)
        if key not in self._cache:
            pos = self.k.positions(s)
            self._cache[key] = torch.nonzero(self.need_blocks[r][pos // self.key_block]).flatten()
        return self._cache[key]

    @cached_property
    def counts(self) -> list[list[int]]:
        """counts[r][s]: how many of rank s's keys rank r needs (r == s included)."""
        P, bk, need = self.world, self.key_block, self.need_blocks
        if self.layout == "striped":
            per_s = [int(need[:, self.k.positions(s) // bk].sum(1).max()) for s in range(P)]
            has = [self.q.size(r) > 0 for r in range(P)]
            return [[per_s[s] if has[r] else 0 for s in range(P)] for r in range(P)]
        nkb = need.shape[1]
        hk = torch.clamp(self.S - torch.arange(nkb) * bk, min=0, max=bk)  # keys per block
        per_chunk = self.k.chunk // bk
        nch = math.ceil(nkb / per_chunk)
        w = torch.zeros(P, nch * per_chunk, dtype=torch.int64)
        w[:, :nkb] = need.long() * hk  # (P, nKb) keys needed per block
        by_chunk = w.reshape(P, nch, per_chunk).sum(-1)  # (P, nChunks)
        return [[int(sum(by_chunk[r, c] for c in self.k.chunks_of(s) if c < nch))
                 for s in range(P)] for r in range(P)]

    def count_needed(self, r: int, s: int) -> int:
        return self.counts[r][s]

    @cached_property
    def all_need_all(self) -> bool:
        """Every rank needs every key of every other rank: a plain all-gather is the exchange."""
        return all(self.counts[r][s] == self.k.size(s)
                   for r in range(self.world) for s in range(self.world) if r != s)

    @cached_property
    def ring_hops(self) -> int:
        """How far key shards must travel along the ring: the largest (r − s) mod P with rank r
        needing some key of rank s."""
        hops = 0
        for r in range(self.world):
            for s in range(self.world):
                if r != s and self.counts[r][s] > 0:
                    hops = max(hops, (r - s) % self.world)
        return hops

    # -- work: what each rank computes (for the cost model) ------------------------------------
    def work_pairs(self) -> list[float]:
        """Attended (query, key) pairs per rank, estimated from tiles: a FULL tile counts its
        area, a PARTIAL one half of it (exact for causal and sliding windows in the limit)."""
        P = self.world
        if self.mask is None:
            return [float(self.q.size(r) * self.S) for r in range(P)]
        bq = self.q.chunk if self.layout != "striped" else max(1, math.ceil(self.L / (2 * P)))
        bk = self.key_block
        t = self.mask.tiles(self.L, self.S, bq, bk)  # (Bm, Hm, nQ, nKb)
        nq, nk = t.shape[-2:]
        hq = torch.clamp(self.L - torch.arange(nq) * bq, max=bq).double()  # rows per q block
        hk = torch.clamp(self.S - torch.arange(nk) * bk, max=bk).double()  # cols per k block
        area = hq[:, None] * hk[None, :]  # (nQ, nKb)
        weight = (t == FULL).double() + 0.5 * (t == PARTIAL).double()
        per_block = (weight * area).mean(dim=(0, 1)).sum(-1)  # (nQ,): averaged over Bm, Hm
        if self.layout == "striped":
            return [float(per_block.sum()) * self.q.size(r) / self.L for r in range(P)]
        return [float(sum(per_block[c] for c in self.q.chunks_of(r) if c < nq)) for r in range(P)]


def _reduce_classes(t: torch.Tensor) -> torch.Tensor:
    """(Bm, Hm, nQ, nK) classes -> (nQ, nK): EMPTY / FULL only where so for all of Bm, Hm."""
    flat = t.flatten(0, 1)
    out = torch.full(flat.shape[1:], PARTIAL, dtype=torch.int8)
    out[(flat == EMPTY).all(0)] = EMPTY
    out[(flat == FULL).all(0)] = FULL
    return out
