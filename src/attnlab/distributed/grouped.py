"""The ring of the hybrid strategy sees groups, not ranks: group g (ranks g·U … g·U + U − 1 of a
layout over P = U·R ranks) holds the union of its members' shards, in member order.

`GroupedSharding` is that split of n tokens over R groups, with the same chunks as the layout
over P ranks (so the mask's tile classes, the transfer sets and the work per rank come out of
`Geometry` unchanged); `GroupedGeometry` is a `Geometry` over R "ranks" that uses it. After the
all-to-all inside a group, each member holds every token of the group for H/U heads, in exactly
this order: the ring then runs over the R groups as it runs over R ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from attnlab.distributed.geometry import Geometry, keys_per_block
from attnlab.distributed.layouts import Piece, Sharding


@dataclass(frozen=True)
class GroupedSharding:
    """n tokens in `layout` over R·U ranks, seen as R groups of U consecutive ranks."""

    base: Sharding  # the layout over all P = R·U ranks
    U: int

    @property
    def n(self) -> int:
        return self.base.n

    @property
    def layout(self) -> str:
        return self.base.layout

    @property
    def world(self) -> int:
        return self.base.world // self.U

    @property
    def chunk(self) -> int:
        return self.base.chunk

    @property
    def n_max(self) -> int:
        return self.U * self.base.n_max

    def owner_of(self, pos: torch.Tensor) -> torch.Tensor:
        """int64 group holding each global position in `pos`."""
        return self.base.owner_of(pos) // self.U

    def members(self, g: int) -> range:
        return range(g * self.U, (g + 1) * self.U)

    def chunks_of(self, g: int) -> list[int]:
        return [c for r in self.members(g) for c in self.base.chunks_of(r)]

    def pieces(self, g: int) -> list[Piece]:
        """The members' pieces one after the other (a member's padding is not kept)."""
        out, at = [], 0
        for r in self.members(g):
            for p in self.base.pieces(r):
                out.append(Piece(at + p.start, p.length, p.positions, p.chunk))
            at += self.base.size(r)
        return out

    def size(self, g: int) -> int:
        return sum(self.base.size(r) for r in self.members(g))

    def positions(self, g: int) -> torch.Tensor:
        ps = self.pieces(g)
        return torch.cat([p.positions for p in ps]) if ps else torch.zeros(0, dtype=torch.int64)

    def rows_in_heads(self, g: int) -> torch.Tensor:
        """(size(g),) int64: where each of group g's tokens sits in a member's (U·n_max) rows
        after the head all-to-all (member m's row j at m·n_max + j)."""
        nm = self.base.n_max
        return torch.cat([m * nm + torch.arange(self.base.size(r), dtype=torch.int64)
                          for m, r in enumerate(self.members(g))])


@dataclass
class GroupedGeometry(Geometry):
    """A `Geometry` over R = world groups of U ranks each (`world` here counts groups)."""

    U: int = 1

    @cached_property
    def q(self) -> GroupedSharding:
        return GroupedSharding(Sharding(self.L, self.layout, self.world * self.U), self.U)

    @cached_property
    def k(self) -> GroupedSharding:
        return GroupedSharding(Sharding(self.S, self.layout, self.world * self.U), self.U)

    def _keys_per_block(self, nkb: int) -> torch.Tensor:
        """int64 (nKb, R): a group holds its members' keys of each block."""
        per_rank = keys_per_block(self.k.base, self.key_block, self.S, nkb)  # (nKb, R·U)
        return per_rank.view(nkb, self.world, self.U).sum(-1)
