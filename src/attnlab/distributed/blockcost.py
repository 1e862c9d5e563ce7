"""What the block strategies (ring, allgather) compute today, for a calibrated cost model.

A (query chunk, key chunk) pair whose tile is FULL runs the fused kernel on its whole area; one
that is PARTIAL evaluates the mask on its rows × columns and runs masked over the whole area too
(`attend.Call.pairs`: the chunk of rows is skipped only when nothing in it may attend); an EMPTY
one is skipped. So a sliding window of W in chunks of c ≫ W costs about c² per diagonal tile, not
c·W: the block path's compute is the *area* of its FULL and PARTIAL tiles, at two rates a
calibration measures (`Calibration.tflops`: a block with no mask; `masked_tflops`: the same block
with a dense mask).

Caution: this models the block path as it is; when PARTIAL blocks skip empty tiles inside them,
the PARTIAL area shrinks toward the attended pairs and this estimate becomes pessimistic.
"""

from __future__ import annotations

import torch

from attnlab.masks import EMPTY, FULL


def block_areas(geom) -> tuple[list[float], list[float]] | None:
    """(FULL area, PARTIAL area) in (query, key) pairs per rank, from the tiles of the layout's
    chunks; None where the layout has no chunk grid (striped, packed documents)."""
    P = geom.world
    if geom.mask is None:
        return [float(geom.q.size(r) * geom.S) for r in range(P)], [0.0] * P
    cc = geom.chunk_classes  # (nQ, nK) int8, EMPTY / FULL only where so for every batch, head
    if cc is None:
        return None
    bq, bk = geom.q.chunk, geom.k.chunk
    nq, nk = cc.shape
    hq = torch.clamp(geom.L - torch.arange(nq) * bq, min=0, max=bq).double()  # rows per chunk
    hk = torch.clamp(geom.S - torch.arange(nk) * bk, min=0, max=bk).double()  # keys per chunk
    area = hq[:, None] * hk[None, :]  # (nQ, nK)
    partial = (cc != FULL) & (cc != EMPTY)
    full_area = (cc == FULL).double() * area
    if geom.mask.is_top_left_causal and geom.L == geom.S:  # diagonal tiles run as is_causal:
        d = torch.arange(min(nq, nk))  # the fused kernel on half of the area, no mask
        full_area[d, d] += 0.5 * area[d, d] * partial[d, d]
        partial[d, d] = False
    full = full_area.sum(1)  # (nQ,)
    part = (partial.double() * area).sum(1)
    rows = [[c for c in geom.q.chunks_of(r) if c < nq] for r in range(P)]
    return ([float(full[c].sum()) for c in rows], [float(part[c].sum()) for c in rows])


def block_compute_s(geom, *, B: int, H: int, D: int, Dv: int, tflops: float,
                    masked_tflops: float) -> float | None:
    """Forward + backward seconds of the busiest rank's blocks (3.5× the forward's
    2·B·H·(D + Dv) FLOPs per computed pair), or None without a chunk grid."""
    areas = block_areas(geom)
    if areas is None:
        return None
    per = 2.0 * B * H * (D + Dv) * 3.5
    return max(per * (f / (tflops * 1e12) + p / (masked_tflops * 1e12)) for f, p in zip(*areas))
