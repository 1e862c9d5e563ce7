"""Hybrid strategy (Ulysses × ring, as USP and TransformerEngine's a2a+p2p): the P ranks form R
groups of U consecutive ranks (U = `ulysses_size`, e.g. the GPUs of one machine).

Inside a group, one all-to-all turns the members' sequence shards into head shards: each member
then holds every token of its group for H/U query heads (K/V heads replicated to lcm(Hkv, U) when U
does not divide Hkv, as `ulysses`). Across groups, member j of every group forms a ring group
(ranks j, U + j, 2U + j, …), and the ring strategy itself (`ring.RingAttention`) runs over it, on
the groups' token sets (`grouped.GroupedGeometry`): only the keys a group's queries may attend
travel, overlapped with compute. out and lse go back to the sequence shards in one all-to-all;
autograd runs backward through all of it.

So the all-to-alls stay on the fast links inside a group and only the ring crosses the slow ones:
bytes per rank are the Ulysses bytes over U ranks (on the intra-group link) plus the ring's over R
groups for H/U heads (on the inter-group link) — `cost.hybrid_estimate` counts exactly those.

Sub-groups are made once per (group, U) with `dist.new_group` (`hybrid_groups`), with the parent
group's timeout, and cached.

Caution: no attention dropout and no per-head masks (as Ulysses); U must divide P and H.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.distributed import comm
from attnlab.distributed.attend import Call
from attnlab.distributed.grouped import GroupedGeometry
from attnlab.distributed.headrule import ulysses_kv_heads
from attnlab.distributed.ring import RingAttention
from attnlab.distributed.ulysses import _OutLseToSeq, _SeqToHeads

#: sub-group timeout when the parent's cannot be read
DEFAULT_TIMEOUT_S = 300.0

_groups: dict = {}


def hybrid_groups(ulysses_size: int, group=None, timeout_s: float | None = None):
    """(ulysses group, ring group) of this rank for groups of `ulysses_size` consecutive ranks of
    `group`; None for a group of one. Every rank of `group` must call it (made once, cached),
    with the parent's timeout unless `timeout_s` says.

    Over the whole world every process enters every `new_group` call, in one order (torch's
    rule). Over a sub-group, only its members take part (`use_local_synchronization`); torch
    names such groups by their ranks and the number of groups the process already has, so the
    members must have made the same number of process groups before (true when every rank
    makes its groups alike; else make these first)."""
    whole = comm.is_world(group)
    ranks = comm.group_ranks(None if whole else group)
    key = (tuple(ranks), ulysses_size)
    if key not in _groups:
        t = comm.group_timeout(group, DEFAULT_TIMEOUT_S) if timeout_s is None else timeout_s
        me = ranks.index(comm.rank_world(None)[0])  # this process's place in the parent
        U, R = ulysses_size, len(ranks) // ulysses_size
        g, j = divmod(me, U)
        ulysses = [[ranks[a * U + m] for m in range(U)] for a in range(R)]
        ring = [[ranks[i * U + b] for i in range(R)] for b in range(U)]
        found = {}
        for members in ulysses + ring:  # one global order; a group of one is no group
            if len(members) == 1 or not (whole or ranks[me] in members):
                continue
            pg = comm.new_group(members, t, local=not whole)
            if ranks[me] in members:
                found[tuple(members)] = pg
        _groups[key] = (found.get(tuple(ulysses[g])), found.get(tuple(ring[j])))
    return _groups[key]


def hybrid_attention(q, k, v, c: Call, *, U: int):
    """This rank's (out (B, H, L_local, Dv), lse (B, H, L_local)), strategy "hybrid"."""
    ug, rg = hybrid_groups(U, c.group)
    g, j = divmod(c.rank, U)
    R = c.world // U
    gq, gk = c.geom.q, c.geom.k
    cu = Call(c.geom, ug, j, U, c.scale, c.softcap, c.acc)  # the all-to-alls: this group
    geo = GroupedGeometry(c.geom.L, c.geom.S, R, c.geom.layout, c.geom.mask, U=U)
    cr = Call(geo, rg, g, R, c.scale, c.softcap, c.acc)  # the ring: member j of every group
    rep = ulysses_kv_heads(k.shape[1], U) // k.shape[1]
    if rep > 1:  # (B, Hkv, n, D) -> (B, lcm(Hkv, U), n, D): head h's copies side by side
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)

    def to_heads(x, n_max, rows):  # (B, h, n, D) -> (B, h/U, n_group, D), members' rows in order
        x = F.pad(x, (0, 0, 0, n_max - x.shape[2]))
        x = _SeqToHeads.apply(x, cu, "forward") if U > 1 else x  # (B, h/U, U·n_max, D)
        return x.index_select(2, rows.to(x.device))

    qrows, krows = geo.q.rows_in_heads(g), geo.k.rows_in_heads(g)
    qg = to_heads(q, gq.n_max, qrows)
    kg, vg = to_heads(k, gk.n_max, krows), to_heads(v, gk.n_max, krows)
    out, lse = RingAttention.apply(qg, kg, vg, cr)  # (B, H/U, n_group, Dv), (B, H/U, n_group)
    # back to the members' padded rows; a padded row reads one extra zero / -inf row
    back = torch.full((U * gq.n_max,), len(qrows), dtype=torch.int64)
    back[qrows] = torch.arange(len(qrows))
    back = back.to(out.device)
    out = torch.cat([out, out.new_zeros(*out.shape[:2], 1, out.shape[-1])], 2).index_select(2, back)
    lse = torch.cat([lse, lse.new_full((*lse.shape[:2], 1), float("-inf"))], 2)
    lse = lse.index_select(2, back)
    if U > 1:  # -> (B, H, n_max, Dv), (B, H, n_max)
        out, lse = _OutLseToSeq.apply(out, lse, cu)
    n = gq.size(c.rank)
    return out[:, :, :n], lse[:, :, :n]
