"""The (query piece, key piece) pairs of a block that have something to attend, and how each
runs: the pair loop of `attend` (float64, dropout, NaN/Inf, masks without per-row intervals; a
block under an interval-shaped mask runs as whole kernel calls instead, `kernel_block`).

A pair whose tiles are all EMPTY is never computed; a FULL pair builds no mask; a PARTIAL pair
evaluates the mask on its global rows × columns and is skipped if nothing in it may attend.
A pair with a dense mask (or dropout's keep mask) goes in chunks of query rows so that no mask
or score buffer exceeds SCORE_BUDGET elements: memory stays linear in the shard length; a FULL or
structured pair runs whole, on the single-process paths that are linear in it by themselves.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from attnlab.distributed import comm
from attnlab.distributed.blockmask import BlockOf
from attnlab.distributed.geometry import Geometry, _tiles_exact
from attnlab.distributed.layouts import Piece
from attnlab.masks import EMPTY, FULL, PARTIAL

#: most score elements (B·H·rows·keys) one block computes at a time
SCORE_BUDGET = 1 << 22

#: `allowed` of a block that is exactly SDPA's top-left causal pattern over equal query and key
#: positions (a causal mask's diagonal blocks): it runs unchunked as is_causal, no dense mask
CAUSAL = "causal"


def block_pairs(c, k_pieces: list[Piece], q: torch.Tensor, log: bool = False):
    """(query piece index, rows of the shard, key piece, allowed: None | CAUSAL | bool mask)
    of every row chunk of every (query piece, key piece) pair with something to attend;
    `log`: count the pairs in an active `comm.record()`."""
    g, per_row = c.geom, q.shape[0] * q.shape[1]
    for qi, qp in enumerate(c.q_pieces):
        for kp in k_pieces:
            cls = g.pair_class(qp, kp)
            if cls == PARTIAL and _structured_block(c, qp, kp) and (
                    qp.chunk is None or kp.chunk is None or not _tiles_exact(g.mask)):
                cls = _run_class(g, qp, kp)  # exact, from tiles or per-row intervals
            if cls == EMPTY:
                continue
            if cls != FULL and _causal_diagonal(c, qp, kp):
                if log:
                    comm.log_pair(qp.length, kp.length)
                yield qi, slice(qp.start, qp.start + qp.length), kp, CAUSAL
                continue
            if cls != FULL and _structured_block(c, qp, kp):
                a, b, kq = _live_block(c, qp, kp)
                if a >= b:
                    continue
                if log:
                    comm.log_pair(qp.length, kp.length)
                yield qi, slice(qp.start + a, qp.start + b), kq, BlockOf(
                    g.mask, int(qp.positions[0]) + a, int(kq.positions[0]), g.L, g.S)
                continue
            # a FULL pair needs no mask and no score buffer (the fused and tiled paths are
            # linear in its rows): one call; dense masks and dropout's keep masks go in chunks
            whole = cls == FULL and c.dropout_p == 0
            step = qp.length if whole else max(1, SCORE_BUDGET // (per_row * kp.length))
            logged = False
            for a in range(0, qp.length, step):
                b = min(a + step, qp.length)
                allowed = None
                if cls != FULL:  # the mask on these global rows x columns
                    allowed = g.mask.block(qp.positions[a:b], kp.positions, g.L, g.S)
                    allowed = allowed.to(q.device)
                    if not bool(allowed.any()):
                        continue
                if log and not logged:
                    comm.log_pair(qp.length, kp.length)
                    logged = True
                yield qi, slice(qp.start + a, qp.start + b), kp, allowed



def _structured_block(c, qp: Piece, kp: Piece) -> bool:
    """The pair runs whole on the single-process path with the global mask seen from the
    block (`BlockOf`): both pieces are runs of consecutive positions, the pair's class is
    exact (a PARTIAL pair has something to attend) and no dropout needs a dense keyed mask."""
    g = c.geom
    return (c.dropout_p == 0 and g.mask is not None and _run(qp) and _run(kp)
            and (_tiles_exact(g.mask) or g.intervals is not None))


def _live_block(c, qp: Piece, kp: Piece) -> tuple[int, int, Piece]:
    """(a, b, keys): the rows [a, b) of run qp that may attend some key of run kp, and the
    sub-run of kp those rows may attend, from the mask's per-row intervals (all of qp and
    kp without them): a window's block against the previous chunk is the band of rows that
    reach back into it against the band of keys they reach, not chunk against chunk."""
    if c.geom.intervals is None:
        return 0, qp.length, kp
    n, lo, hi = _keys_seen(c.geom, qp, kp)  # (Bm, Hm, rows) each
    live = n > 0
    rows = live.reshape(-1, qp.length).any(0).nonzero()  # (m, 1) ascending
    if rows.numel() == 0:
        return 0, 0, kp
    k0 = int(kp.positions[0])
    c = int(torch.where(live, lo, k0 + kp.length).min()) - k0
    d = int(torch.where(live, hi, k0).max()) - k0
    if (c, d) != (0, kp.length):
        kp = replace(kp, start=kp.start + c, length=d - c, positions=kp.positions[c:d],
                     chunk=None)
    return int(rows[0, 0]), int(rows[-1, 0]) + 1, kp


def _causal_diagonal(c, qp: Piece, kp: Piece) -> bool:
    """Under a plain causal mask, the block of a run of consecutive positions against the
    same positions is top-left causal (no dropout: its keyed mask needs the dense block)."""
    g = c.geom
    return (c.dropout_p == 0 and g.mask is not None and g.mask.is_top_left_causal
            and g.L == g.S and qp.length == kp.length and qp.length > 0
            and int(qp.positions[-1] - qp.positions[0]) == qp.length - 1
            and bool(torch.equal(qp.positions, kp.positions)))


def _run(p: Piece) -> bool:
    """The piece holds consecutive global positions."""
    return p.chunk is not None or (p.length > 0
                                   and int(p.positions[-1] - p.positions[0]) == p.length - 1)


def _keys_seen(g: Geometry, qp: Piece, kp: Piece):
    """int64 (Bm, Hm, rows) each: how many keys of run kp each row of run qp may attend, and the
    global bounds [lo, hi) of those keys, from the mask's per-row intervals (g.intervals must
    exist)."""
    q0, k0 = int(qp.positions[0]), int(kp.positions[0])
    lo, hi = (x[..., q0:q0 + qp.length].long() for x in g.intervals)  # global key bounds
    lo, hi = torch.clamp(lo, min=k0), torch.clamp(hi, max=k0 + kp.length)
    return (hi - lo).clamp(min=0), lo, hi


def _run_class(g: Geometry, qp: Piece, kp: Piece) -> int:
    """EMPTY, PARTIAL or FULL of a block of two runs, from the mask's tile arithmetic (exact for
    masks whose tiles are exact), the same for every batch element and head only if so."""
    q0, k0 = int(qp.positions[0]), int(kp.positions[0])
    if g.intervals is not None:  # exact for any interval-shaped mask, `&` included
        n = _keys_seen(g, qp, kp)[0]
        if not bool(n.any()):
            return EMPTY
        return FULL if bool((n == kp.length).all()) else PARTIAL
    t = g.mask._tiles(torch.tensor([[q0]]), torch.tensor([[q0 + qp.length - 1]]),
                      torch.tensor([[k0]]), torch.tensor([[k0 + kp.length - 1]]), g.L, g.S)
    t = t.reshape(-1)
    if bool((t == EMPTY).all()):
        return EMPTY
    return FULL if bool((t == FULL).all()) else PARTIAL
