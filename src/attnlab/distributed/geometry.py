"""The global picture every rank computes for itself: where tokens live, which (query, key) pieces
the mask leaves anything in, and which key rows each rank needs from each other rank.

All of it comes from the mask's tile classes on global positions, so every rank derives the same
answer with no communication, and the cost model (`plan`) uses the very same numbers.

Transfer sets (which keys a rank receives) are exact at the granularity of `key_block` (one key
for S <= 4096): from tile classes where they are exact, else (striped layouts, `&` / `|` masks)
from the mask evaluated on the PARTIAL tiles of a coarser grid, as long as those hold at most
EXACT_BUDGET elements. Caution: beyond that budget they fall back to the tiles, which are
conservative there: a transfer may then carry a key no query attends; it never misses one that
some query does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import torch

from attnlab.distributed.layouts import Piece, Sharding
from attnlab.masks import EMPTY, FULL, PARTIAL, Mask
from attnlab.masks.base import And, Not, Or

#: key-side granularity of transfer planning: at most this many key blocks over the sequence
MAX_KEY_BLOCKS = 4096
#: tiles per side of the grid that refines transfer sets where tile classes are not exact
REFINE_TILES = 128
#: most mask elements (Bm·Hm·rows·keys of PARTIAL tiles) evaluated to make those sets exact
EXACT_BUDGET = 1 << 24


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
        """bool (world, nKb): rank r has a query that may attend some key of key block b.

        Contiguous and zigzag layouts under masks whose tile classes are exact (all but `&`, `|`):
        from (query chunk, key block) tiles. Otherwise (striped, or `&` / `|`): see `_need_refined`.
        """
        P, bk = self.world, self.key_block
        nkb = math.ceil(self.S / bk)
        has_rows = torch.tensor([self.q.size(r) > 0 for r in range(P)])
        if self.mask is None:
            return has_rows[:, None].expand(P, nkb).clone()
        if self.layout == "striped" or not _tiles_exact(self.mask):
            return self._need_refined(nkb)
        t = self.mask.tiles(self.L, self.S, self.q.chunk, bk)  # (Bm, Hm, nQ, nKb)
        live = (t != EMPTY).flatten(0, 1).any(0)  # (nQ, nKb)
        need = torch.zeros(P, nkb, dtype=torch.bool)
        for r in range(P):
            rows = [c for c in self.q.chunks_of(r) if c < live.shape[0]]
            if rows:
                need[r] = live[rows].any(0)
        return need

    def _need_refined(self, nkb: int) -> torch.Tensor:
        """need_blocks from a grid of about REFINE_TILES² tiles: a FULL tile is needed by every
        rank with a row in it, an EMPTY one by none, and a PARTIAL one is evaluated (the mask on
        its rows × columns, one call per query tile), as long as the PARTIAL tiles' area stays
        within EXACT_BUDGET; beyond that a PARTIAL tile counts as needed by every rank with a row
        in it (conservative)."""
        P, kb, m, L, S = self.world, self.key_block, self.mask, self.L, self.S
        bq = math.ceil(L / REFINE_TILES)
        bk = kb * math.ceil(math.ceil(S / REFINE_TILES) / kb)  # whole key blocks per tile
        t = m.tiles(L, S, bq, bk).flatten(0, 1)  # (Bm·Hm, nQ, nK)
        full, live = (t == FULL).any(0), (t != EMPTY).any(0)  # (nQ, nK)
        partial = live & ~full
        owner = torch.empty(L, dtype=torch.int64)  # the rank of each query position
        for r in range(P):
            owner[self.q.positions(r)] = r
        # (P, nQ): 1 where rank r has a row in tile i
        has = torch.zeros(P, full.shape[0], dtype=torch.float32)
        has[owner, torch.arange(L) // bq] = 1.0
        exact = int(partial.sum()) * bq * bk * m.batch_size * m.heads <= EXACT_BUDGET
        by_tile = (has @ (full if exact else live).float()) > 0  # (P, nQ) @ (nQ, nK)
        need = by_tile.repeat_interleave(bk // kb, dim=1)[:, :nkb].clone()  # (P, nKb)
        if not exact:
            return need
        hits = torch.zeros(P, nkb, dtype=torch.float32)
        for i in torch.nonzero(partial.any(1)).flatten().tolist():
            rows = torch.arange(i * bq, min((i + 1) * bq, L))
            cols = torch.cat([torch.arange(j * bk, min((j + 1) * bk, S))
                              for j in torch.nonzero(partial[i]).flatten().tolist()])
            allowed = m.block(rows, cols, L, S).flatten(0, 1).any(0)  # (rows, cols)
            mine = (owner[rows][None, :] == torch.arange(P)[:, None]).float()  # (P, rows)
            # (P, rows) @ (rows, cols) -> (P, cols): rank r has a row that may attend the key
            hits.index_add_(1, cols // kb, mine @ allowed.float())
        return need | (hits > 0)

    def rows_needed(self, r: int, s: int) -> torch.Tensor:
        """int64 local row indices of rank s's keys that rank r needs."""
        key = ("rows", r, s)
        if key not in self._cache:
            pos = self.k.positions(s)
            self._cache[key] = torch.nonzero(self.need_blocks[r][pos // self.key_block]).flatten()
        return self._cache[key]

    def received_pieces(self, r: int, s: int) -> list[Piece]:
        """The pieces of what rank r receives from rank s: s's needed rows in s's local order. A
        piece that is a whole chunk keeps the chunk (so its tile class applies); a part of one
        has none (its pairs evaluate the mask)."""
        rows, out, start = self.rows_needed(r, s), [], 0
        for p in self.k.pieces(s):
            sel = rows[(rows >= p.start) & (rows < p.start + p.length)] - p.start
            if len(sel):
                whole = len(sel) == p.length
                out.append(Piece(start, len(sel), p.positions[sel], p.chunk if whole else None))
                start += len(sel)
        return out

    @cached_property
    def counts(self) -> list[list[int]]:
        """counts[r][s]: how many of rank s's keys rank r needs (r == s included)."""
        P, bk = self.world, self.key_block
        owner = torch.empty(self.S, dtype=torch.int64)
        for s in range(P):
            owner[self.k.positions(s)] = s
        nkb = self.need_blocks.shape[1]
        per_block = torch.zeros(nkb, P, dtype=torch.int64)  # keys of each owner in each block
        per_block.index_put_((torch.arange(self.S) // bk, owner),
                             torch.ones(self.S, dtype=torch.int64), accumulate=True)
        return (self.need_blocks.long() @ per_block).tolist()  # (P, nKb) @ (nKb, P) -> (P, P)

    def count_needed(self, r: int, s: int) -> int:
        return self.counts[r][s]

    @cached_property
    def all_need_all(self) -> bool:
        """Every rank needs every key of every other rank: a plain all-gather is the exchange."""
        return all(self.counts[r][s] == self.k.size(s)
                   for r in range(self.world) for s in range(self.world) if r != s)

    def peers(self, r: int) -> tuple[list[int], list[int]]:
        """(ranks that need some of r's keys, ranks r needs some keys of), r itself excluded."""
        P, cnt = self.world, self.counts
        return ([d for d in range(P) if d != r and cnt[d][r]],
                [s for s in range(P) if s != r and cnt[r][s]])

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


def _tiles_exact(m: Mask) -> bool:
    """Whether the mask's tile classes are exact (PARTIAL: something attends, something not)."""
    if isinstance(m, (And, Or)):
        return False
    return _tiles_exact(m.a) if isinstance(m, Not) else True


def _reduce_classes(t: torch.Tensor) -> torch.Tensor:
    """(Bm, Hm, nQ, nK) classes -> (nQ, nK): EMPTY / FULL only where so for all of Bm, Hm."""
    flat = t.flatten(0, 1)
    out = torch.full(flat.shape[1:], PARTIAL, dtype=torch.int8)
    out[(flat == EMPTY).all(0)] = EMPTY
    out[(flat == FULL).all(0)] = FULL
    return out
