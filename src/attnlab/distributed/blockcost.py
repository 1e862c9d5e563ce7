"""What the block strategies (ring, allgather) and ulysses compute today, for a calibrated cost
model.

Every (query chunk, key chunk) pair runs on the single-process engine: a FULL pair runs the fused
kernel over its whole area; a PARTIAL one runs the global mask seen from the block (`BlockOf`),
where the tiled kernel skips EMPTY tiles and the interval kernel computes each query panel's
union of key intervals, so its work follows the pairs it attends, not its area; an EMPTY pair is
skipped. Under a causal mask over L == S the diagonal pairs run as is_causal (the fused kernel on
half of the area). So the model prices two things per rank (`block_areas`):

- the area of its FULL pairs (plus half of the causal diagonal), at `Calibration.tflops` (a block
  with no mask);
- the attended pairs of its PARTIAL pairs, estimated from SUB_TILES × SUB_TILES sub-tiles of
  each chunk pair (a FULL sub-tile counts its area, a PARTIAL one half of it — no per-position
  structure), at `Calibration.masked_tflops` (a sliding-window block through `attnlab.attention`,
  counting only the pairs it attends: the engine's overhead per attended pair is in the rate).

Ulysses runs the whole sequence for H/P heads on the same engine: the same two terms over the
whole grid, over P.

Caution: the rate of a PARTIAL block depends on its shape (a narrow window pays more panel
overhead per attended pair than a wide one); the calibration measures one window, so the model is
closest for windows near it. Dropout blocks run dense keyed masks and are not priced here.
"""

from __future__ import annotations

import math

import torch

from attnlab.masks import EMPTY, FULL, PARTIAL

#: most sub-tiles per side of a chunk that PARTIAL chunk pairs are priced on
SUB_TILES = 16
#: most sub-tile classes (Bm·Hm·rows·columns of the sub-tile grid) one estimate builds
SUB_TILE_BUDGET = 1 << 20


def block_areas(geom) -> tuple[list[float], list[float]] | None:
    """(FULL area, attended pairs of PARTIAL chunk pairs) per rank, in (query, key) pairs, from
    the tiles of the layout's chunks; None where the layout has no chunk grid (striped, packed
    documents)."""
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
    attended = torch.zeros_like(area)
    if bool(partial.any()):
        attended = partial.double() * attended_pairs(geom.mask, geom.L, geom.S, bq, bk, nq, nk)
    full = full_area.sum(1)  # (nQ,)
    part = attended.sum(1)
    rows = [[c for c in geom.q.chunks_of(r) if c < nq] for r in range(P)]
    return ([float(full[c].sum()) for c in rows], [float(part[c].sum()) for c in rows])


def attended_pairs(mask, L: int, S: int, bq: int, bk: int, nq: int, nk: int) -> torch.Tensor:
    """float64 (nQ, nK): estimated attended (query, key) pairs of each chunk pair (chunks of bq
    queries, bk keys), averaged over the mask's batch and heads: the chunk cut into sq × sk
    sub-tiles (sq the largest divisor of bq up to the budget's side), a FULL sub-tile counting
    its area and a PARTIAL one half of it (exact in the limit for windows and documents)."""
    side = math.isqrt(max(1, SUB_TILE_BUDGET // (mask.batch_size * mask.heads * nq * nk)))
    sq, sk = _divisor(bq, min(SUB_TILES, side)), _divisor(bk, min(SUB_TILES, side))
    tq, tk = bq // sq, bk // sk  # rows, keys per sub-tile
    t = mask.tiles(L, S, tq, tk)  # (Bm, Hm, nQt, nKt)
    mq, mk = t.shape[-2:]
    rq = torch.clamp(L - torch.arange(mq) * tq, min=0, max=tq).double()  # rows per sub-tile
    rk = torch.clamp(S - torch.arange(mk) * tk, min=0, max=tk).double()  # keys per sub-tile
    weight = ((t == FULL).double() + 0.5 * (t == PARTIAL).double()).mean(dim=(0, 1))
    sub = weight * (rq[:, None] * rk[None, :])  # (nQt, nKt) attended pairs per sub-tile
    sub = torch.nn.functional.pad(sub, (0, nk * sk - mk, 0, nq * sq - mq))
    return sub.view(nq, sq, nk, sk).sum(dim=(1, 3))  # (nQ, nK)


def _divisor(n: int, most: int) -> int:
    """The largest divisor of n that is at most `most` (1 at least)."""
    return next(d for d in range(max(1, min(n, most)), 0, -1) if n % d == 0)


def _seconds(areas, B: int, H: int, D: int, Dv: int, tflops: float, masked_tflops: float):
    """Forward + backward seconds of each rank's blocks (3.5× the forward's 2·B·H·(D + Dv) FLOPs
    per computed pair)."""
    per = 2.0 * B * H * (D + Dv) * 3.5
    return [per * (f / (tflops * 1e12) + p / (masked_tflops * 1e12)) for f, p in zip(*areas)]


def block_compute_s(geom, *, B: int, H: int, D: int, Dv: int, tflops: float,
                    masked_tflops: float) -> float | None:
    """Forward + backward seconds of the busiest rank's blocks (ring, allgather), or None
    without a chunk grid."""
    areas = block_areas(geom)
    if areas is None:
        return None
    return max(_seconds(areas, B, H, D, Dv, tflops, masked_tflops))


def ulysses_compute_s(geom, *, B: int, H: int, D: int, Dv: int, tflops: float,
                      masked_tflops: float) -> float | None:
    """Forward + backward seconds of a rank of ulysses (all positions, H/P heads, on the same
    engine): every rank's blocks together, over P; None without a chunk grid."""
    areas = block_areas(geom)
    if areas is None:
        return None
    return sum(_seconds(areas, B, H, D, Dv, tflops, masked_tflops)) / geom.world
