"""A global mask seen from one (query run, key run) block: the mask a block of consecutive query
positions q0 … q0 + Lb − 1 against consecutive key positions k0 … k0 + Sb − 1 hands the
single-process op, so the block runs on exactly the path one process takes (the tiled kernel
skipping EMPTY tiles, no mask work on FULL ones, fused chunks) with no dense host mask.

    BlockOf(m, q0, k0, L, S) at local (i, j) == m at global (q0 + i, k0 + j) of an L × S problem.
"""

from __future__ import annotations

import torch

from attnlab.masks import Mask
from attnlab.masks.band import band_tiles
from attnlab.masks.base import classify

#: most mask elements (Bm·Hm·rows·keys) a block's tile classes evaluate at a time
BAND_ENTRIES = 1 << 24


class BlockOf(Mask):
    """The global mask `m` of an L × S problem on the block starting at (q0, k0)."""

    def __init__(self, m: Mask, q0: int, k0: int, L: int, S: int):
        self.m, self.q0, self.k0, self.L, self.S = m, int(q0), int(k0), int(L), int(S)
        self.batch_size, self.heads = m.batch_size, m.heads

    def _block(self, rows, cols, Lb, Sb):
        return self.m._block(rows + self.q0, cols + self.k0, self.L, self.S)

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, Lb, Sb):
        """Exact classes of the block's tiles (q_lo, q_hi (nQ, 1), k_lo, k_hi (1, nK), local and
        consecutive): from the block's own per-row intervals where the global mask has them,
        else from the mask evaluated on the block's rows × columns. Never from the global
        mask's `_tiles` at shifted bounds: several kinds (a band's, a function's, a dense
        mask's) take the bounds as the whole problem's grid, which a block's are not."""
        if q_lo.numel() == 0 or k_lo.numel() == 0:
            return torch.zeros(self.batch_size, self.heads, q_lo.shape[0], k_lo.shape[-1],
                               dtype=torch.int8, device=q_lo.device)
        got = self.intervals(Lb, Sb, device=q_lo.device)
        a, b = int(q_lo[0, 0]), int(q_hi[-1, 0]) + 1  # the rows these tiles cover
        k_first, k_last = k_lo[0], k_hi[0]
        if got is None:
            return self._evaluated(torch.arange(a, b, device=q_lo.device), q_lo[:, 0],
                                   k_first, int(k_last[-1]) + 1, Lb, Sb)
        lo, hi = (x[..., a:b].long() for x in torch.broadcast_tensors(*got))  # (Bm, Hm, b − a)
        lo = lo.clamp(min=int(k_first[0]))
        hi = hi.clamp(max=int(k_last[-1]) + 1)
        return band_tiles(lo, hi, q_lo[:, 0] - a, k_first, k_last)

    def _evaluated(self, rows, q_first, k_first, k_end: int, Lb: int, Sb: int) -> torch.Tensor:
        """int8 (Bm, Hm, nQ, nK) from the mask on `rows` × [k_first[0], k_end), a band of rows
        at a time (at most BAND_ENTRIES mask elements), reduced into tiles by block ids."""
        dev, n = rows.device, self.batch_size * self.heads
        nq, nk = q_first.numel(), k_first.numel()
        cols = torch.arange(int(k_first[0]), k_end, device=dev)
        k_blk = torch.searchsorted(k_first, cols, right=True) - 1  # (C,): tile of each column
        hit = torch.zeros(n, nq, nk, dtype=torch.uint8, device=dev)  # some pair attends
        every = torch.ones(n, nq, nk, dtype=torch.uint8, device=dev)  # every pair attends
        band = max(1, BAND_ENTRIES // max(1, n * cols.numel()))
        for r0 in range(0, rows.numel(), band):
            r = rows[r0:r0 + band]
            m = self.block(r, cols, Lb, Sb).reshape(n, r.numel(), -1).to(torch.uint8)
            idx = k_blk.expand(n, r.numel(), -1)  # (Bm·Hm, R, C)
            c_hit = m.new_zeros(n, r.numel(), nk).scatter_reduce_(2, idx, m, "amax")
            c_all = m.new_ones(n, r.numel(), nk).scatter_reduce_(2, idx, m, "amin")
            q_idx = (torch.searchsorted(q_first, r, right=True) - 1)[None, :, None]
            hit.scatter_reduce_(1, q_idx.expand(n, -1, nk), c_hit, "amax")
            every.scatter_reduce_(1, q_idx.expand(n, -1, nk), c_all, "amin")
        out = classify(every.bool(), hit == 0)  # (Bm·Hm, nQ, nK)
        return out.reshape(self.batch_size, self.heads, nq, nk)

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
