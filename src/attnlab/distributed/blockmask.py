"""A global mask seen from one (query run, key run) block: the mask a block of consecutive query
positions q0 … q0 + Lb − 1 against consecutive key positions k0 … k0 + Sb − 1 hands the
single-process op, so the block runs on exactly the path one process takes (the tiled kernel
skipping EMPTY tiles, no mask work on FULL ones, fused chunks) with no dense host mask.

    BlockOf(m, q0, k0, L, S) at local (i, j) == m at global (q0 + i, k0 + j) of an L × S problem.
"""

from __future__ import annotations

from attnlab.masks import Mask


class BlockOf(Mask):
    """The global mask `m` of an L × S problem on the block starting at (q0, k0)."""

    def __init__(self, m: Mask, q0: int, k0: int, L: int, S: int):
        self.m, self.q0, self.k0, self.L, self.S = m, int(q0), int(k0), int(L), int(S)
        self.batch_size, self.heads = m.batch_size, m.heads

    def _block(self, rows, cols, Lb, Sb):
        return self.m._block(rows + self.q0, cols + self.k0, self.L, self.S)

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, Lb, Sb):
        return self.m._tiles(q_lo + self.q0, q_hi + self.q0, k_lo + self.k0, k_hi + self.k0,
                             self.L, self.S)

    @property
    def shift_invariant(self) -> bool:  # (q0 + i) − (k0 + j) depends on i − j only
        return self.m.shift_invariant

    @property
    def is_top_left_causal(self) -> bool:
        return self.m.is_top_left_causal and self.q0 == self.k0

    def _intervals(self, Lb: int, Sb: int, device=None):
        """Per-row key intervals of the block: the global mask's rows q0 … q0 + Lb − 1, shifted
        by k0 (clamped to the block by `Mask.intervals`); None where the global mask has none.
        With them the single-process path runs an interval-shaped block on the interval kernel."""
        got = self.m.intervals(self.L, self.S, device=device)  # computed once, kept with m
        if got is None:
            return None
        return tuple(x[..., self.q0:self.q0 + Lb].long() - self.k0 for x in got)  # (Bm, Hm, Lb)

    def __repr__(self):
        return f"BlockOf({self.m!r}, q0={self.q0}, k0={self.k0})"
