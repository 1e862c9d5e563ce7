"""Ring strategy: every key/value shard goes from its owner straight to the ranks that need it,
one ring distance at a time, while each rank computes.

Forward, step t = 1 … P−1: rank r sends to rank (r + t) mod P the rows of its keys and values
that rank's queries may attend (none: no message), and receives from rank (r − t) mod P the rows
it needs of that rank's. Step t + 1's transfers are posted before step t computes (step 0 is the
rank's own keys), so communication overlaps compute and at most two received blocks are held.
A rank never receives a key none of its queries may attend: a shard no longer passes through
ranks on its way, causal rank 0 receives nothing, a sliding window exchanges only halos, a
document mask talks only to the ranks that share a document.

Backward: the same transfers again (nothing of size S is kept between the passes); each rank
computes the dK/dV partials (fp32, fp64 for fp64 inputs) of the rows it received and sends them
straight back to their owner, which adds them to its own; dQ stays local. A rank's own block
runs in two parts of the key/value heads where it can (`attend.in_parts`): the first while the
first block travels, the second while the last partials travel back. The forward's out and lse
are reused; nothing of size L×S is kept.
"""

from __future__ import annotations

import torch

from attnlab.distributed import attend
from attnlab.distributed.attend import Call
from attnlab.distributed.comm import Exchange
from attnlab.ops import kernels

TAG_K, TAG_V, TAG_DK, TAG_DV = 11, 12, 13, 14
ROWS, GRADS = "key/value rows", "key/value gradients"  # what a peer waits for


def _steps(c: Call) -> list[int]:
    """The ring distances t at which this rank sends or receives anything."""
    P, cnt, r = c.world, c.geom.counts, c.rank
    return [t for t in range(1, P) if cnt[(r + t) % P][r] or cnt[r][(r - t) % P]]


def _fetch(c: Call, t: int, k, v, phase: str):
    """Post step t: my keys that rank r + t needs go there; rank r − t's that I need come here.
    Returns (exchange, k block, v block, its pieces) — blocks None when nothing comes."""
    P, r, g = c.world, c.rank, c.geom
    dst, src = (r + t) % P, (r - t) % P
    ex = Exchange(c.group, phase)
    rows = g.rows_needed(dst, r).to(k.device)
    if len(rows):  # (B, Hkv, m, D) -> dst: the m keys its queries may attend
        whole = len(rows) == k.shape[2]
        ex.send(k if whole else _picked(k, rows), dst, TAG_K, ROWS)
        ex.send(v if whole else _picked(v, rows), dst, TAG_V, ROWS)
    m = g.count_needed(r, src)
    kb = vb = None
    if m:  # (B, Hkv, m, D) <- src: the m keys of src my queries may attend
        kb = ex.recv(_buffer(k, m), src, TAG_K, ROWS)
        vb = ex.recv(_buffer(v, m), src, TAG_V, ROWS)
    return ex.post(), kb, vb, g.received_pieces(r, src)


def _buffer(like: torch.Tensor, m: int) -> torch.Tensor:
    """(B, H, m, D) like `like` for a transfer: float32 from the kernel's pool of freed blocks
    (`kernels.zeros`), so a large call's messages reuse the blocks its kernel calls freed
    instead of adding fresh memory beside the blocks the pool holds."""
    return kernels.zeros(*like.shape[:2], m, like.shape[-1], dtype=like.dtype, device=like.device)


def _picked(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x's rows `rows` (dim 2) as a new contiguous tensor, from the pool as `_buffer`."""
    return torch.index_select(x, 2, rows, out=_buffer(x, len(rows)))


def _return(c: Call, t: int, dk_b, dv_b, like_k, like_v):
    """Post the dK/dV partials of step t to their owner (rank r − t) and receive mine from
    rank r + t. Returns (exchange, rows, dk part, dv part) — parts None when nothing comes."""
    P, r, g = c.world, c.rank, c.geom
    src, dst = (r - t) % P, (r + t) % P
    ex = Exchange(c.group, "backward")
    if dk_b is not None:  # (B, Hkv, m, D) fp32 -> owner: grads of the keys it sent me
        ex.send(dk_b, src, TAG_DK, GRADS)
        ex.send(dv_b, src, TAG_DV, GRADS)
    rows = g.rows_needed(dst, r).to(like_k.device)
    gk = gv = None
    if len(rows):  # (B, Hkv, m, D) fp32 <- dst: grads of the keys I sent it
        m = len(rows)
        gk = ex.recv(_buffer(like_k, m), dst, TAG_DK, GRADS)
        gv = ex.recv(_buffer(like_v, m), dst, TAG_DV, GRADS)
    return ex.post(), rows, gk, gv


def _absorb(pending, dk, dv) -> None:
    """Wait for a posted return and add the partials that came into this rank's dK, dV."""
    ex, rows, gk, gv = pending
    ex.wait()
    if gk is not None:
        dk.index_add_(2, rows, gk)
        dv.index_add_(2, rows, gv)


def _forward(ctx, q, k, v, c: Call):
    Dv = v.shape[-1]
    q_acc = q.to(c.acc)
    state = attend.start_state(c, q, Dv)
    steps = _steps(c)
    attend.settle(c, q_acc)  # what the pool kept from earlier calls
    nxt = _fetch(c, steps[0], k, v, "forward") if steps else None
    attend.forward_block(c, state, q_acc, k, v, c.geom.k.pieces(c.rank))
    for i in range(len(steps)):
        ex, kb, vb, pieces = nxt
        ex.wait()
        attend.settle(c, q_acc)
        nxt = _fetch(c, steps[i + 1], k, v, "forward") if i + 1 < len(steps) else None
        if kb is not None:  # computed while step i + 1's transfers travel
            attend.forward_block(c, state, q_acc, kb, vb, pieces)
        del ex, kb, vb  # the block is freed once merged
    return attend.finish_forward(ctx, c, state, q, k, v)


def _backward(ctx, c: Call, q, k, v, saved, dq):
    steps = _steps(c)
    lean = attend.lean(c, saved[0])  # large: no transfer overlaps a block (attend.lean)
    attend.settle(c, saved[0])  # the forward's blocks, whole-shard sized: not the backward's
    nxt = _fetch(c, steps[0], k, v, "backward") if steps else None
    if lean and nxt is not None:
        nxt[0].wait()  # the rows sent (copies) are freed before the own block runs
        attend.settle(c, saved[0])
    own = c.geom.k.pieces(c.rank)
    # this rank's own keys' gradients (B, Hkv, S_local, D|Dv), acc dtype: in two parts of the
    # heads when it can, the second computed while the last step's partials travel back
    parts = attend.in_parts(c, saved, k, v, own) if steps else [None]
    dk, dv = attend.backward_block(c, saved, dq, k, v, own, kv_heads=parts[0])
    pending = None
    for i, t in enumerate(steps):
        ex, kb, vb, pieces = nxt
        ex.wait()
        nxt = _fetch(c, steps[i + 1], k, v, "backward") if i + 1 < len(steps) else None
        dk_b = dv_b = None
        if kb is not None:  # (B, Hkv, m, D|Dv) partials of rank (r − t)'s keys, written over
            # the received rows once each piece is done (acc dtype): no second buffer
            dk_b, dv_b = attend.backward_block(c, saved, dq, kb, vb, pieces, reuse=True)
        del ex, kb, vb
        if pending is not None:
            _absorb(pending, dk, dv)
        attend.settle(c, saved[0])  # the block's one-head tiles: not the partials' size
        pending = _return(c, t, dk_b, dv_b, dk, dv)  # travels while step t + 1 computes
        del dk_b, dv_b
        if lean:  # ... unless large: the partials sent and received are freed first
            _absorb(pending, dk, dv)
            pending = None
        if lean and nxt is not None:
            nxt[0].wait()
        attend.settle(c, saved[0])
    if len(parts) > 1:  # ... or while the own block's second part computes
        attend.backward_block(c, saved, dq, k, v, own, kv_heads=parts[1], into=(dk, dv))
    if pending is not None:
        _absorb(pending, dk, dv)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


RingAttention = attend.strategy_function("RingAttention", _forward, _backward)
