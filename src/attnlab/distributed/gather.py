"""All-gather strategy: fetch the keys this rank needs once, attend, send key gradients back.

When every rank needs every key (no mask, a document mask with one long document, ...) the fetch
is one `all_gather_into_tensor` of K and V by key/value heads (GQA moves Hkv heads, not H) and the
backward one `reduce_scatter` of dK, dV in fp32 (fp64). Otherwise only the needed rows move, point
to point: a sliding window fetches the halo of W − 1 keys from its neighbours, a document mask
talks only to the ranks that share a document, causal rank 0 fetches nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.distributed import attend, comm
from attnlab.distributed.attend import Call
from attnlab.distributed.comm import Exchange

TAG_K, TAG_V, TAG_DK, TAG_DV = 21, 22, 23, 24
ROWS, GRADS = "key/value rows", "key/value gradients"  # what a peer waits for


def padded(x: torch.Tensor, n_max: int) -> torch.Tensor:
    """(B, Hkv, n, D) -> (B, Hkv, n_max, D): zero rows appended (never attended)."""
    return F.pad(x, (0, 0, 0, n_max - x.shape[2])).contiguous()


def _dense_gather(c: Call, k, v, phase: str):
    """Every rank's padded (B, Hkv, n_max, D) shards, as a list of (k, v, pieces) per rank."""
    n_max = c.geom.k.n_max
    parts = []
    for x in (k, v):
        part = padded(x, n_max)  # (B, Hkv, S/P, D)
        out = part.new_empty((c.world, *part.shape))  # (P, B, Hkv, S/P, D)
        comm.all_gather(out.view(-1), part.view(-1), c.group, phase)  # P·B·Hkv·(S/P)·D
        parts.append(out)
    return [(parts[0][s], parts[1][s], c.geom.k.pieces(s)) for s in range(c.world)]


def _sparse_gather(c: Call, k, v, phase: str):
    """The rows each rank needs, point to point, as a list of (k, v, pieces) per source rank."""
    B, Hkv, _, D = k.shape
    Dv = v.shape[-1]
    ex = Exchange(c.group, phase)
    blocks = [(k, v, c.geom.k.pieces(c.rank))]
    for s in range(c.world):
        if s == c.rank:
            continue
        rows = c.geom.rows_needed(s, c.rank).to(k.device)
        if len(rows):  # (B, Hkv, m, D) -> rank s: the m keys its queries may attend
            ex.send(k.index_select(2, rows), s, TAG_K, ROWS)
            ex.send(v.index_select(2, rows), s, TAG_V, ROWS)
        need = c.geom.rows_needed(c.rank, s)
        if len(need):  # (B, Hkv, m, D) <- rank s
            kr = ex.recv(k.new_empty(B, Hkv, len(need), D), s, TAG_K, ROWS)
            vr = ex.recv(v.new_empty(B, Hkv, len(need), Dv), s, TAG_V, ROWS)
            blocks.append((kr, vr, c.geom.received_pieces(c.rank, s)))
    ex.post().wait()
    return blocks


def _forward(ctx, q, k, v, c: Call):
    dense = c.world > 1 and c.geom.all_need_all
    gather = _dense_gather if dense else _sparse_gather
    blocks = gather(c, k, v, "forward")
    q_acc, Dv = q.to(c.acc), v.shape[-1]
    state = attend.start_state(c, q, Dv)
    for kb, vb, pieces in blocks:
        attend.forward_block(c, state, q_acc, kb, vb, pieces)
    ctx.dense = dense
    return attend.finish_forward(ctx, c, state, q, k, v)


def _backward(ctx, c: Call, q, k, v, saved, dq):
    gather = _dense_gather if ctx.dense else _sparse_gather
    blocks = gather(c, k, v, "backward")  # fetched again: nothing of size S is kept
    grads = [attend.backward_block(c, saved, dq, kb, vb, pieces) for kb, vb, pieces in blocks]
    n = k.shape[2]
    if ctx.dense:
        dk, dv = _reduce_scatter(c, grads)
    else:
        dk, dv = _sparse_return(c, grads, k, v)
    return dq.to(q.dtype), dk[:, :, :n].to(k.dtype), dv[:, :, :n].to(v.dtype), None



def _reduce_scatter(c: Call, grads):
    out = []
    for i in (0, 1):
        full = torch.stack([g[i] for g in grads])  # (P, B, Hkv, S/P, D) fp32
        mine = full.new_empty(full.shape[1:])  # (B, Hkv, S/P, D)
        comm.reduce_scatter(mine.view(-1), full.view(-1), c.group, "backward")
        out.append(mine)
    return out


def _sparse_return(c: Call, grads, k, v):
    dk, dv = grads[0]  # this rank's own keys
    ex = Exchange(c.group, "backward")
    back, i = [], 1
    for s in range(c.world):
        if s == c.rank:
            continue
        if c.geom.count_needed(c.rank, s):  # (B, Hkv, m, D) fp32 -> rank s: grads of its keys
            ex.send(grads[i][0], s, TAG_DK, GRADS)
            ex.send(grads[i][1], s, TAG_DV, GRADS)
            i += 1
        rows = c.geom.rows_needed(s, c.rank).to(dk.device)
        if len(rows):  # (B, Hkv, m, D) fp32 <- rank s: grads of the keys it fetched from here
            gk = ex.recv(dk.new_empty(*dk.shape[:2], len(rows), dk.shape[-1]), s, TAG_DK, GRADS)
            gv = ex.recv(dv.new_empty(*dv.shape[:2], len(rows), dv.shape[-1]), s, TAG_DV, GRADS)
            back.append((rows, gk, gv))
    ex.post().wait()
    for rows, gk, gv in back:
        dk.index_add_(2, rows, gk)
        dv.index_add_(2, rows, gv)
    return dk, dv


GatherAttention = attend.strategy_function("GatherAttention", _forward, _backward)
