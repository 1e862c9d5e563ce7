"""Ulysses strategy: all-to-all from sequence shards to head shards, attention on the whole
sequence for H/P heads, all-to-all back.

Each rank ends up with every token of H/P query heads (so H must divide by P) and of the
key/value heads they read: Hkv/P of them when P divides Hkv; otherwise (GQA with fewer key/value
heads than ranks, MQA, ...) each key/value head is replicated lcm(Hkv, P)/Hkv times before the
all-to-all, as DeepSpeed-Ulysses does, so every rank receives whole heads
(`headrule.ulysses_kv_heads`; the replicas' gradients sum back through autograd). It puts the tokens
in global order and runs `attnlab.attention` with the mask
itself, which skips empty tiles and keeps memory linear in L. Autograd runs through the
all-to-alls (each one's backward is the other). out and lse go back to the sequence shards in one
all-to-all (their bytes side by side), and their gradients come back in one: the lse's always, zeros
where a rank's loss does not use it (B·H·L_local values in the accumulation dtype, against the
B·H·L_local·Dv of out's), so every rank runs the same collectives whichever of out and lse its
loss uses; every rank must still run the backward.

With attention dropout the whole-sequence attention of a rank's heads runs in row chunks on the
plain block math (`blocks.dropout_forward` / `dropout_backward`) with the keyed mask of the global
(batch, head, row, column) it computes, heads numbered as in the whole call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.distributed import comm, keyed
from attnlab.distributed.attend import Call
from attnlab.distributed.blocks import dropout_backward, dropout_forward
from attnlab.distributed.headrule import ulysses_kv_heads
from attnlab.distributed.pairs import SCORE_BUDGET


class _SeqToHeads(torch.autograd.Function):
    """(B, H, n_max, D) sequence shard -> (B, H/P, P·n_max, D) head shard, ranks concatenated."""

    @staticmethod
    def forward(ctx, x, c: Call, phase: str):
        ctx.c, ctx.phase = c, phase
        return seq_to_heads(x, c, phase)

    @staticmethod
    def backward(ctx, g):
        return heads_to_seq(g, ctx.c, "backward"), None, None


class _OutLseToSeq(torch.autograd.Function):
    """out (B, H/P, P·n_max, Dv) and lse (B, H/P, P·n_max) head shards -> (B, H, n_max, Dv) and
    (B, H, n_max) sequence shards in one all-to-all; backward, both gradients in one (a gradient
    autograd leaves out arrives as zeros, so every rank sends the same bytes)."""

    @staticmethod
    def forward(ctx, out, lse, c: Call):
        ctx.c = c
        both = heads_to_seq([out, _as(lse, out.dtype)], c, "forward")  # (B, H, n_max, Dv + a/e)
        return both[..., :out.shape[-1]], _from(both[..., out.shape[-1]:], lse.dtype)

    @staticmethod
    def backward(ctx, dout, dlse):  # None (no gradient) arrives as zeros: materialized
        both = seq_to_heads([dout, _as(dlse, dout.dtype)], ctx.c, "backward")
        return both[..., :dout.shape[-1]], _from(both[..., dout.shape[-1]:], dlse.dtype), None


def _as(lse, dtype):
    """(B, h, n) -> (B, h, n, a/e): each lse's bytes as elements of `dtype` (a, the lse's element
    size, is a multiple of e, the output's), so out and lse travel side by side in one buffer and
    copy at the dtype's speed."""
    return lse[..., None].contiguous().view(dtype)


def _from(x, lse_dtype):
    """(B, h, n, a/e) -> (B, h, n) of `lse_dtype`, the inverse of `_as`."""
    return x.contiguous().view(lse_dtype)[..., 0]


def _send_buffer(parts, shape):
    """(P, B, h, n, ΣX) holding the parts (each viewed as (P, B, h, n, X_i)) side by side."""
    buf = parts[0].new_empty(*shape, sum(p.shape[-1] for p in parts))
    at = 0
    for p in parts:
        buf[..., at:at + p.shape[-1]] = p
        at += p.shape[-1]
    return buf


def seq_to_heads(x, c: Call, phase: str):
    """(B, H, n, D) -> (B, H/P, P·n, D); a list of (B, H, n, D_i) goes in one all-to-all, side by
    side: (B, H/P, P·n, ΣD_i)."""
    parts = x if isinstance(x, list) else [x]
    B, H, n = parts[0].shape[:3]
    P = c.world
    send = _send_buffer([p.reshape(B, P, H // P, n, p.shape[-1]).transpose(0, 1)
                         for p in parts], (P, B, H // P, n))  # (P, B, H/P, n, D)
    D = send.shape[-1]
    recv = torch.empty_like(send)  # (P, B, H/P, n, D): [j] = rank j's tokens of my heads
    with comm.during(c.call_no, phase):
        comm.all_to_all(recv.view(-1), send.view(-1), c.group, phase)  # B·H·n·D·bytes·(P−1)/P
    return recv.permute(1, 2, 0, 3, 4).reshape(B, H // P, P * n, D)  # -> (B, H/P, P·n, D)


def heads_to_seq(y, c: Call, phase: str):
    """(B, H/P, P·n, X) -> (B, H, n, X); a list of (B, H/P, P·n, X_i) goes in one all-to-all,
    side by side: (B, H, n, ΣX_i)."""
    parts = y if isinstance(y, list) else [y]
    B, Hp, Pn = parts[0].shape[:3]
    P = c.world
    n = Pn // P
    send = _send_buffer([p.reshape(B, Hp, P, n, p.shape[-1]).permute(2, 0, 1, 3, 4)
                         for p in parts], (P, B, Hp, n))  # (P, B, H/P, n, X)
    X = send.shape[-1]
    recv = torch.empty_like(send)  # (P, B, H/P, n, X): [j] = my tokens of rank j's heads
    with comm.during(c.call_no, phase):
        comm.all_to_all(recv.view(-1), send.view(-1), c.group, phase)  # B·H·n·X·bytes·(P−1)/P
    return recv.transpose(0, 1).reshape(B, P * Hp, n, X)  # -> (B, H, n, X)


def ulysses_attention(q, k, v, c: Call, *, mask, enable_gqa: bool):
    """This rank's (out (B, H, L_local, Dv), lse (B, H, L_local))."""
    from attnlab.ops import attention

    gq, gk = c.geom.q, c.geom.k
    P = c.world

    def to_heads(x, n_max):  # (B, H, n, D) -> (B, H/P, P·n_max, D)
        x = F.pad(x, (0, 0, 0, n_max - x.shape[2]))
        return _SeqToHeads.apply(x, c, "forward") if P > 1 else x

    rep = ulysses_kv_heads(k.shape[1], P) // k.shape[1]
    if rep > 1:  # (B, Hkv, n, D) -> (B, lcm(Hkv, P), n, D): head h's copies side by side
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    qh, kh, vh = to_heads(q, gq.n_max), to_heads(k, gk.n_max), to_heads(v, gk.n_max)
    q_order, k_order = gq.owner_order().to(q.device), gk.owner_order().to(q.device)
    qg = qh.index_select(2, q_order)  # (B, H/P, L, D) in global token order
    kg, vg = kh.index_select(2, k_order), vh.index_select(2, k_order)  # (B, Hkv/P, S, D)
    if c.dropout_p > 0:  # this rank holds query heads rank·H/P ... (rank + 1)·H/P − 1
        out, lse = _KeyedDropout.apply(qg.to(c.acc), kg.to(c.acc), vg.to(c.acc), c, mask,
                                       c.rank * qg.shape[1])
        out = out.to(q.dtype)
    else:
        out, lse = attention(qg, kg, vg, mask=mask, scale=c.scale,
                             enable_gqa=enable_gqa or kg.shape[1] != qg.shape[1],
                             softcap=c.softcap, return_lse=True)
    # back to rank-concatenated padded order; padded rows read one extra zero / -inf row
    back = torch.full((P * gq.n_max,), gq.n, dtype=torch.int64)
    back[q_order.cpu()] = torch.arange(gq.n)
    back = back.to(q.device)
    out = torch.cat([out, out.new_zeros(*out.shape[:2], 1, out.shape[-1])], 2).index_select(2, back)
    pad = lse.new_full((*lse.shape[:2], 1), float("-inf"))
    lse = torch.cat([lse, pad], 2).index_select(2, back)
    if P > 1:  # -> (B, H, n_max, Dv), (B, H, n_max)
        out, lse = _OutLseToSeq.apply(out, lse, c)
    n = gq.size(c.rank)
    return out[:, :, :n], lse[:, :, :n]


def _chunks(c: Call, q, k, mask, head0: int):
    """(rows slice, allowed or None, keep) per chunk of query rows of the whole sequence."""
    B, H, L = q.shape[:3]
    S = k.shape[2]
    cols = torch.arange(S, device=q.device)
    heads = torch.arange(head0, head0 + H)
    step = max(1, SCORE_BUDGET // (B * H * max(S, 1)))
    for a in range(0, L, step):
        rows = torch.arange(a, min(a + step, L), device=q.device)
        allowed = None
        if mask is not None:  # (Bm, Hm, rows, S); a per-head mask: this rank's heads
            allowed = mask.block(rows, cols, L, S).to(q.device)
            if allowed.shape[1] > 1:
                allowed = allowed[:, head0:head0 + H]
        keep = keyed.keep_mask(c.dropout_seed, c.dropout_p, B, heads, rows, cols)
        yield slice(a, a + len(rows)), allowed, keep


class _KeyedDropout(torch.autograd.Function):
    """Attention of the whole sequence (B, H/P, L, D) under keyed dropout, in row chunks; the
    backward recomputes each chunk's weights from the saved lse (nothing L × S is kept)."""

    @staticmethod
    def forward(ctx, q, k, v, c: Call, mask, head0: int):
        out = q.new_zeros(*q.shape[:3], v.shape[-1])  # (B, H/P, L, Dv)
        lse = q.new_full(q.shape[:3], float("-inf"))  # (B, H/P, L)
        for r, allowed, keep in _chunks(c, q, k, mask, head0):
            out[:, :, r], lse[:, :, r] = dropout_forward(q[:, :, r], k, v, allowed, c.scale,
                                                         c.softcap, keep, c.dropout_p)
        ctx.c, ctx.mask, ctx.head0 = c, mask, head0
        ctx.save_for_backward(q, k, v, out, lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        c = ctx.c
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dout = torch.zeros_like(out) if dout is None else dout.to(out.dtype)
        for r, allowed, keep in _chunks(c, q, k, ctx.mask, ctx.head0):
            dq[:, :, r], dk_b, dv_b = dropout_backward(
                q[:, :, r], k, v, allowed, c.scale, c.softcap, keep, c.dropout_p, out[:, :, r],
                lse[:, :, r], dout[:, :, r], None if dlse is None else dlse[:, :, r])
            dk += dk_b
            dv += dv_b
        return dq, dk, dv, None, None, None
