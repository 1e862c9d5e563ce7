"""Ulysses strategy: all-to-all from sequence shards to head shards, attention on the whole
sequence for H/P heads, all-to-all back.

Each rank ends up with every token of H/P query heads and Hkv/P key/value heads (so H and Hkv must
both divide by P), puts the tokens in global order and runs `attnlab.attention` with the mask
itself, which skips empty tiles and keeps memory linear in L. Autograd runs through the
all-to-alls (each one's backward is the other), the returned lse's included: its gradient travels
back to the head shards only when a loss uses the lse (B·H·L_local values in the accumulation
dtype), so every rank's loss must use it alike, as every rank must run the backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.distributed import comm
from attnlab.distributed.attend import Call


class _SeqToHeads(torch.autograd.Function):
    """(B, H, n_max, D) sequence shard -> (B, H/P, P·n_max, D) head shard, ranks concatenated."""

    @staticmethod
    def forward(ctx, x, c: Call, phase: str):
        ctx.c, ctx.phase = c, phase
        return seq_to_heads(x, c, phase)

    @staticmethod
    def backward(ctx, g):
        return heads_to_seq(g, ctx.c, "backward"), None, None


class _HeadsToSeq(torch.autograd.Function):
    """(B, H/P, P·n_max, X) head shard -> (B, H, n_max, X) sequence shard."""

    @staticmethod
    def forward(ctx, y, c: Call, phase: str):
        ctx.c = c
        return heads_to_seq(y, c, phase)

    @staticmethod
    def backward(ctx, g):
        return seq_to_heads(g, ctx.c, "backward"), None, None


def seq_to_heads(x, c: Call, phase: str):
    B, H, n, D = x.shape
    P = c.world
    send = x.reshape(B, P, H // P, n, D).transpose(0, 1).contiguous()  # (P, B, H/P, n, D)
    recv = torch.empty_like(send)  # (P, B, H/P, n, D): [j] = rank j's tokens of my heads
    comm.all_to_all(recv.view(-1), send.view(-1), c.group, phase)  # B·H·n·D·bytes·(P−1)/P
    return recv.permute(1, 2, 0, 3, 4).reshape(B, H // P, P * n, D)  # -> (B, H/P, P·n, D)


def heads_to_seq(y, c: Call, phase: str):
    B, Hp, Pn, X = y.shape
    P = c.world
    n = Pn // P
    send = y.reshape(B, Hp, P, n, X).permute(2, 0, 1, 3, 4).contiguous()  # (P, B, H/P, n, X)
    recv = torch.empty_like(send)  # (P, B, H/P, n, X): [j] = my tokens of rank j's heads
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

    qh, kh, vh = to_heads(q, gq.n_max), to_heads(k, gk.n_max), to_heads(v, gk.n_max)
    q_order, k_order = gq.owner_order().to(q.device), gk.owner_order().to(q.device)
    qg = qh.index_select(2, q_order)  # (B, H/P, L, D) in global token order
    kg, vg = kh.index_select(2, k_order), vh.index_select(2, k_order)  # (B, Hkv/P, S, D)
    out, lse = attention(qg, kg, vg, mask=mask, scale=c.scale, enable_gqa=enable_gqa,
                         softcap=c.softcap, return_lse=True)
    # back to rank-concatenated padded order; padded rows read one extra zero / -inf row
    back = torch.full((P * gq.n_max,), gq.n, dtype=torch.int64)
    back[q_order.cpu()] = torch.arange(gq.n)
    back = back.to(q.device)
    out = torch.cat([out, out.new_zeros(*out.shape[:2], 1, out.shape[-1])], 2).index_select(2, back)
    pad = lse.new_full((*lse.shape[:2], 1), float("-inf"))
    lse = torch.cat([lse, pad], 2).index_select(2, back)
    if P > 1:
        out = _HeadsToSeq.apply(out, c, "forward")  # (B, H, n_max, Dv)
        lse = _HeadsToSeq.apply(lse[..., None], c, "forward")[..., 0]  # (B, H, n_max)
    n = gq.size(c.rank)
    return out[:, :, :n], lse[:, :, :n]
