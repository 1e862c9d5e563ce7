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

    @cached_property
    def intervals(self):
        """(lo, hi) int32 (Bm, Hm, L) per-row key intervals of the mask, or None (no mask, a
        mask that has none, or one that is not interval-shaped). O(L)."""
        fn = getattr(self.mask, "intervals", None)
        return None if fn is None else fn(self.L, self.S)

    # -- key needs: what a rank receives ---------------------------------------------------------
    @cached_property
    def key_block(self) -> int:
        """Keys per block of transfer planning: 1 (exact) up to MAX_KEY_BLOCKS blocks, else about
        S / MAX_KEY_BLOCKS: the largest divisor of the chunk up to that (so blocks never straddle
        two ranks' chunks) when one is at least half of it, else that size itself (a block may
        then straddle a chunk border: its keys go to every rank that needs any key of it)."""
        target = math.ceil(self.S / MAX_KEY_BLOCKS)
        if target <= 1 or self.layout == "striped":
            return max(1, target)
        c = self.k.chunk
        if c <= target:
            return c
        d = next(d for d in range(target, 0, -1) if c % d == 0)
        return d if 2 * d >= target else target

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
        has = self._ranks_in_tiles(bq, full.shape[0])  # (P, nQ): 1 where rank r has a row
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
            mine = (self.q.owner_of(rows)[None, :] == torch.arange(P)[:, None]).float()  # (P, rows)
            # (P, rows) @ (rows, cols) -> (P, cols): rank r has a row that may attend the key
            hits.index_add_(1, cols // kb, mine @ allowed.float())
        return need | (hits > 0)

    def _ranks_in_tiles(self, bq: int, nq: int) -> torch.Tensor:
        """float32 (P, nq): 1 where rank r holds a query row of tile i (rows i·bq ... ), by
        arithmetic on the layout (no per-position structure)."""
        P, sh = self.world, self.q
        has = torch.zeros(P, nq, dtype=torch.float32)
        if self.layout == "striped":  # tile i holds positions i·bq .. : ranks (i·bq + j) mod P
            lo = torch.arange(nq, dtype=torch.int64) * bq
            n = torch.clamp(self.L - lo, max=bq)  # rows in each tile
            for j in range(min(bq, P)):  # the j-th row of a tile, where there is one
                has[(lo + j) % P, torch.arange(nq)] += (n > j).float()
            return (has > 0).float()
        for r in range(P):
            for ch in sh.chunks_of(r):
                a, b = ch * sh.chunk, min(self.L, (ch + 1) * sh.chunk)
                if b > a:
                    has[r, a // bq:(b - 1) // bq + 1] = 1.0
        return has

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
        return self.count_matrix.tolist()

    @cached_property
    def count_matrix(self) -> torch.Tensor:
        """int64 (P, P): `counts` as a tensor."""
        nkb = self.need_blocks.shape[1]
        per_block = self._keys_per_block(nkb)  # (nKb, P): keys of each owner in each block
        # (P, nKb) @ (nKb, P) -> (P, P), in float64 (exact below 2^53 keys; BLAS, not int64)
        return (self.need_blocks.double() @ per_block.double()).round().long()

    def _keys_per_block(self, nkb: int) -> torch.Tensor:
        """int64 (nKb, P): how many keys of rank s key block b holds."""
        return keys_per_block(self.k, self.key_block, self.S, nkb)

    def count_needed(self, r: int, s: int) -> int:
        return self.counts[r][s]

    @cached_property
    def all_need_all(self) -> bool:
        """Every rank needs every key of every other rank: a plain all-gather is the exchange."""
        P = self.world
        sizes = torch.tensor([self.k.size(s) for s in range(P)], dtype=torch.int64)
        off = ~torch.eye(P, dtype=torch.bool)
        return bool((self.count_matrix == sizes[None, :])[off].all())

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


def keys_per_block(k, bk: int, S: int, nkb: int) -> torch.Tensor:
    """int64 (nKb, P): how many keys of rank s key block b of size `bk` holds under sharding `k`,
    by arithmetic (blocks of contiguous/zigzag layouts lie inside one chunk; striped blocks hold
    keys of every rank)."""
    P = k.world
    lo = torch.arange(nkb, dtype=torch.int64) * bk
    hi = torch.clamp(lo + bk, max=S)  # (nKb,)
    if k.layout == "striped":  # #{i in [lo, hi): i ≡ s mod P} for each s
        s = torch.arange(P, dtype=torch.int64)
        return (torch.div(hi[:, None] - 1 - s + P, P, rounding_mode="floor")
                - torch.div(lo[:, None] - 1 - s + P, P, rounding_mode="floor"))
    c = k.chunk  # >= bk: a block meets at most two chunks, split at the border
    mid = torch.clamp((lo // c + 1) * c, max=hi)  # (nKb,): the first chunk's end
    out = torch.zeros(nkb, P, dtype=torch.int64)
    idx = torch.arange(nkb)
    out.index_put_((idx, k.owner_of(lo)), mid - lo, accumulate=True)
    out.index_put_((idx, k.owner_of(torch.clamp(mid, max=S - 1))), hi - mid, accumulate=True)
    return out
