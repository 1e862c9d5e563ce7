"""How a sequence is split over P ranks: which global tokens each rank holds, and in what order.

Three layouts, all defined on a sequence of n tokens padded (internally, invisibly) to whole chunks:

- ``"contiguous"``: P chunks of c = ceil(n / P) tokens; rank r holds chunk r.
- ``"zigzag"``: 2P chunks of c = ceil(n / 2P); rank r holds chunks r and 2P−1−r, in that order,
  so every rank gets one early and one late chunk and causal work is balanced.
- ``"striped"``: token i lives on rank i mod P, in increasing order.

A chunk that runs past n is cut short; a rank whose chunks lie wholly past n holds nothing (n < P
works). A rank's shard is a list of `Piece`s: runs of local rows with their global positions; the
padded shard length `n_max` is what travels in fixed-size collectives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnlab.errors import AttnlabError, check_choice

LAYOUTS = ("contiguous", "zigzag", "striped")


@dataclass(frozen=True)
class Piece:
    """Rows [start, start + length) of a rank's shard hold the global tokens `positions`."""

    start: int
    length: int
    positions: torch.Tensor  # (length,) int64, global token index of each row
    chunk: int | None  # index of the layout chunk this run is (None: striped, no chunks)


@dataclass(frozen=True)
class Sharding:
    """The split of n tokens over `world` ranks in one layout."""

    n: int
    layout: str
    world: int

    @property
    def chunk(self) -> int:
        """Tokens per chunk (contiguous, zigzag); for striped, the tokens per rank at most."""
        parts = 2 * self.world if self.layout == "zigzag" else self.world
        return max(1, math.ceil(self.n / parts))

    @property
    def n_max(self) -> int:
        """Padded shard length: every rank's shard fits, so fixed-size collectives can carry it."""
        return 2 * self.chunk if self.layout == "zigzag" else self.chunk

    def chunks_of(self, rank: int) -> list[int]:
        if self.layout == "zigzag":
            return [rank, 2 * self.world - 1 - rank]
        return [rank]

    def pieces(self, rank: int) -> list[Piece]:
        """The non-empty runs of `rank`'s shard, in local order."""
        if self.layout == "striped":
            if rank >= self.n:
                return []
            pos = torch.arange(rank, self.n, self.world, dtype=torch.int64)
            return [Piece(0, len(pos), pos, None)]
        out, start = [], 0
        for ch in self.chunks_of(rank):
            lo = ch * self.chunk
            hi = min(lo + self.chunk, self.n)
            if hi > lo:
                out.append(Piece(start, hi - lo, torch.arange(lo, hi, dtype=torch.int64), ch))
                start += hi - lo
        return out

    def size(self, rank: int) -> int:
        """Rows of `rank`'s shard, by arithmetic (no positions built)."""
        if self.layout == "striped":
            return len(range(rank, self.n, self.world))
        return sum(max(0, min(self.n, (ch + 1) * self.chunk) - ch * self.chunk)
                   for ch in self.chunks_of(rank))

    def owner_of(self, pos: torch.Tensor) -> torch.Tensor:
        """int64 rank holding each global position in `pos`, by arithmetic."""
        if self.layout == "striped":
            return pos % self.world
        ch = pos // self.chunk
        if self.layout == "zigzag":
            return torch.where(ch < self.world, ch, 2 * self.world - 1 - ch)
        return ch

    def positions(self, rank: int) -> torch.Tensor:
        ps = self.pieces(rank)
        return torch.cat([p.positions for p in ps]) if ps else torch.zeros(0, dtype=torch.int64)

    def owner_order(self) -> torch.Tensor:
        """(n,) int64: for each global token, its row in the rank-concatenated padded shards
        (rank r's row j sits at r·n_max + j)."""
        order = torch.empty(self.n, dtype=torch.int64)
        for r in range(self.world):
            pos = self.positions(r)
            order[pos] = r * self.n_max + torch.arange(len(pos))
        return order


def check_layout(layout: str) -> None:
    check_choice("layout", layout, LAYOUTS)


def positions(L: int, layout: str, rank: int, world: int) -> torch.Tensor:
    """(L_local,) int64: the global token index of each local row of `rank` in `layout`.

        >>> positions(8, "zigzag", 0, 2).tolist()
        [0, 1, 6, 7]
    """
    check_layout(layout)
    for name, v, lo in (("L", L, 0), ("world", world, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise AttnlabError(f"{name}: expected an int >= {lo}, got {v!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise AttnlabError(f"rank: expected an int in [0, {world}), got {rank!r}")
    return Sharding(L, layout, world).positions(rank)
