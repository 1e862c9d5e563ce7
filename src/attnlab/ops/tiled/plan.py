"""Tile planning for the tiled backend: which key columns each query block must visit, and where.

The masks classify every (query-block, key-block) tile as EMPTY, PARTIAL or FULL without building
the L×S matrix. The plan turns that into work: for each block of `block_q` query rows, a list of
contiguous key ranges ("chunks"). EMPTY tiles are never visited; a chunk made only of FULL tiles
does no mask work at all; a chunk holding a PARTIAL tile evaluates the mask for just that chunk.
Neighbouring tiles of the same kind merge into one chunk (capped in width so the scores of one
chunk stay small), so a sliding window or a sorted document mask costs one or two batched matmuls
per query block over (B·H).

When the chunks go to PyTorch's fused kernel (`tiled.fused`), short mask-free runs fold into
their masked neighbour (one call instead of two) and query blocks with identical mask-free chunks
merge (a sorted document mask becomes one call per document).

The classes are unions over the batch and head dims of the mask: a tile is skipped only when it is
empty for every batch element and head, and is mask-free only when it is full for all of them.

One call builds its plan once (`plan_for`, kept with the call's Problem): the "auto" choice reads
its `density`, and the tiled kernel then runs the same plan.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from attnlab.masks import EMPTY, FULL, from_dense
from attnlab.ops.problem import Problem

#: query rows per block; key columns per classification tile
BLOCK_Q = 128
BLOCK_K = 64
#: bytes one chunk's fp32 score matrix (B·H, block_q, width) may take
CHUNK_BYTES = 16 * 2**20
#: with the fused kernel, a mask-free run narrower than this joins its masked neighbour
MIN_FREE = 1024


@dataclass(frozen=True)
class Chunk:
    k0: int  # first key column
    k1: int  # one past the last
    masked: bool  # holds a PARTIAL tile (or a float bias): evaluate the mask here


@dataclass(frozen=True)
class Plan:
    rows: tuple[tuple[int, int, tuple[Chunk, ...]], ...]  # (q0, q1, chunks) per query block
    density: float  # fraction of the (query-block, key-block) tiles visited (1.0 = dense work)


def tile_classes(p: Problem, block_q: int, block_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(nonempty, maskfree) bool (nQ, nK): some pair may attend / no mask work is needed."""
    L, S = p.dims.L, p.dims.S
    nq, nk = -(-L // block_q), -(-S // block_k)
    nonempty = torch.ones(nq, nk, dtype=torch.bool)
    maskfree = torch.ones(nq, nk, dtype=torch.bool)
    sources = []
    if p.structured is not None:
        sources.append(p.structured.tiles(L, S, block_q, block_k))  # (Bm, Hm, nQ, nK)
    if p.attn_mask is not None:
        m = p.attn_mask if p.attn_mask.dtype == torch.bool else p.attn_mask != float("-inf")
        m = m.detach().cpu()
        m = m.reshape(-1, *m.shape[-2:]) if m.dim() > 2 else m  # (Bm·Hm, L|1, S|1)
        m = m.expand(*m.shape[:-2], L, S)  # (Bm·Hm, L|1, S|1) -> (Bm·Hm, L, S)
        sources.append(from_dense(m).tiles(L, S, block_q, block_k))
        if p.attn_mask.dtype != torch.bool:
            maskfree[:] = False  # a float bias is added on every visited tile
    for t in sources:
        t = t.cpu().reshape(-1, nq, nk)  # (Bm, Hm, nQ, nK) -> (Bm·Hm, nQ, nK)
        nonempty &= (t != EMPTY).any(0)
        maskfree &= (t == FULL).all(0)
    return nonempty, maskfree


def make_plan(p: Problem, block_q: int = BLOCK_Q, block_k: int = BLOCK_K, *,
              fused: bool = False) -> Plan:
    """The chunks each query block visits, in the order the kernels walk them.

    `fused`: chunks go to PyTorch's fused kernel, which tiles internally, so free chunks need no
    width cap, short free runs are cheaper folded into a neighbouring masked chunk than run as a
    separate call, and neighbouring query blocks with the same mask-free chunks become one call.
    """
    L, S = p.dims.L, p.dims.S
    nonempty, maskfree = tile_classes(p, block_q, block_k)
    heads = max(1, p.dims.H) * max(1, _batch(p))
    width = max(block_k, CHUNK_BYTES // (4 * heads * block_q) // block_k * block_k)
    kind = torch.where(nonempty, torch.where(maskfree, 2, 1), 0).tolist()  # 0 skip 1 mask 2 free
    rows = []
    for i, row in enumerate(kind):
        q0, q1 = i * block_q, min(L, (i + 1) * block_q)
        runs, col = [], 0
        for k, run in itertools.groupby(row):
            n = len(list(run))
            if k:
                runs.append([col * block_k, min(S, (col + n) * block_k), k == 1])
            col += n
        if fused:
            runs = _fold_short_free(runs)
        chunks = []
        for lo, hi, masked in runs:
            step = hi - lo if fused and not masked else width
            chunks += [Chunk(c0, min(hi, c0 + step), masked) for c0 in range(lo, hi, step)]
        if fused and rows and rows[-1][2] == tuple(chunks) and not any(c.masked for c in chunks):
            rows[-1] = (rows[-1][0], q1, rows[-1][2])  # same free keys: one bigger call
        else:
            rows.append((q0, q1, tuple(chunks)))
    density = float(nonempty.float().mean()) if nonempty.numel() else 0.0
    return Plan(rows=tuple(rows), density=density)


def _fold_short_free(runs: list) -> list:
    """Merge touching runs into masked ones where the free part is narrower than MIN_FREE."""
    out = []
    for lo, hi, masked in runs:
        if out and out[-1][1] == lo and (
            (masked and (out[-1][2] or out[-1][1] - out[-1][0] < MIN_FREE))
            or (not masked and out[-1][2] and hi - lo < MIN_FREE)
        ):
            out[-1] = [out[-1][0], hi, True]
        else:
            out.append([lo, hi, masked])
    return out


def plan_for(p: Problem, fused: bool) -> Plan:
    """The plan of this call, built on first use and kept with the Problem."""
    key = ("tiled.plan", fused)
    if key not in p.memo:
        p.memo[key] = make_plan(p, fused=fused)
    return p.memo[key]


def _batch(p: Problem) -> int:
    n = 1
    for b in p.dims.batch:
        n *= b
    return n
