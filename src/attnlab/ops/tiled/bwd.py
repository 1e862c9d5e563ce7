"""Tiled backward: recompute each chunk's weights from the saved lse, never store them.

With P = exp(s - lse) (the softmax weights), Z the dropout multiplier and dO the output gradient:

    dV = (P·Z)ᵀ @ dO;   dP = (dO @ Vᵀ)·Z;   dS = P · (dP - δ),  δ = rowsum(dO · out) - dlse
    dQ = scale · dS @ K;  dK = scale · dSᵀ @ Q

(rowsum(dO · out) equals rowsum(P·dP) because out = (P·Z) @ V; dlse, the gradient of the returned
lse = log Σ exp(s), adds P·dlse to dS since d lse_i / d s_ij = P_ij.) Softcap multiplies dS by
1 - tanh². out and lse may be global: the rows' output and lse over more keys than this call's
(a context-parallel block), and the result is then this call's keys' share. Rows with
lse = -inf (nothing to attend) get P = 0 and so gradient 0 (`scores.lse_for_exp`). dK and dV
accumulate in the accumulation dtype over (B, Hkv, S, D) buffers; per query block only one chunk
of scores is alive.

`_bwd` is the dispatcher, like the forward's: one row block at a time, on the fused path
(`tiled.fused.bwd_rows`) or the pure PyTorch path (`_pure_rows` here); both return the block's dQ
and add its shares of dK and dV.
"""

from __future__ import annotations

import torch

from attnlab.ops import fused_cpu, scores
from attnlab.ops.tiled import fused
from attnlab.ops.tiled.chunk import alive_columns, chunk_allowed, chunk_scores
from attnlab.ops.tiled.fwd import q_rows
from attnlab.ops.tiled.setup import Setup, dropout_keep, generator


def _bwd(st: Setup, q, k, v, out, lse, dout, dlse=None):
    """Gradients (dq, dk, dv) in the inputs' dtypes; q, k, v, out, lse as `_fwd`'s, dout as out,
    dlse as lse or None (zero)."""
    extra = 0
    if dlse is not None and st.fused:  # the fused kernel takes dlse as one more column
        q, k, v, out, dout, extra = fused_cpu.with_lse_grad(q, k, v, out, dout, dlse)
        dlse = None
    G, D, Dv = st.G, q.shape[-1], v.shape[-1]
    q5 = q.reshape(st.B, st.Hkv, G, st.L, D)  # (B, H, L, D) -> (B, Hkv, G, L, D)
    out5 = out.reshape(st.B, st.Hkv, G, st.L, Dv)  # (B, H, L, Dv) -> (B, Hkv, G, L, Dv)
    do5 = dout.reshape(st.B, st.Hkv, G, st.L, Dv)  # (B, H, L, Dv) -> (B, Hkv, G, L, Dv)
    lse5 = lse.reshape(st.B, st.Hkv, G, st.L)  # (B, H, L) -> (B, Hkv, G, L)
    dlse5 = None if dlse is None else dlse.reshape(st.B, st.Hkv, G, st.L)  # like lse5
    dq = torch.zeros(st.B, st.Hkv, G, st.L, D, dtype=q.dtype, device=q.device)
    dk = torch.zeros(st.B, st.Hkv, st.S, D, dtype=st.acc, device=q.device)
    dv = torch.zeros(st.B, st.Hkv, st.S, Dv, dtype=st.acc, device=q.device)
    rows = fused.bwd_rows if st.fused else _pure_rows
    gen = generator(st, q.device)  # replays the forward's dropout, in the same order
    for q0, q1, chunks in st.plan.rows:
        if chunks:
            g = rows(st, q5, k, v, out5, lse5, do5, q0, q1, chunks, dk, dv, gen, dlse5)
            dq[:, :, :, q0:q1] = g  # (B, Hkv, G, bq, D)
    dq = dq.view(q.shape)  # (B, Hkv, G, L, D) -> (B, H, L, D)
    dk, dv = dk.view(k.shape).to(k.dtype), dv.view(v.shape).to(v.dtype)  # (B, Hkv, S, D|Dv)
    if extra:  # drop the lse columns: (.., D + extra) -> (.., D)
        dq, dk, dv = (x[..., :-extra] for x in (dq, dk, dv))
    return dq, dk, dv


def _pure_rows(st: Setup, q5, k, v, out5, lse5, do5, q0, q1, chunks, dk, dv, gen, dlse5=None):
    """dq rows (B, Hkv, G, bq, D) in the accumulation dtype of one row block, with plain PyTorch
    ops; adds this block's shares to dk (B, Hkv, S, D) and dv (B, Hkv, S, Dv)."""
    N, G, bq, D, Dv = st.B * st.Hkv, st.G, q1 - q0, q5.shape[-1], v.shape[-1]
    k3, v3 = k.reshape(N, st.S, D), v.reshape(N, st.S, Dv)  # (B, Hkv, S, ·) -> (N, S, ·)
    dk3, dv3 = dk.view(N, st.S, D), dv.view(N, st.S, Dv)  # views: the adds below land in dk, dv
    qb = q_rows(st, q5, q0, q1)  # (N, G·bq, D)
    dob = do5[:, :, :, q0:q1].to(st.acc).reshape(N, G * bq, Dv)  # (B, Hkv, G, bq, Dv) -> 3-D
    ob = out5[:, :, :, q0:q1].to(st.acc).reshape(N, G * bq, Dv)  # -> (N, G·bq, Dv)
    delta = (dob * ob).sum(-1, keepdim=True)  # (N, G·bq, 1): rowsum(dO · out)
    if dlse5 is not None:
        delta = delta - dlse5[:, :, :, q0:q1].to(st.acc).reshape(N, G * bq, 1)  # - dlse
    lse_b = scores.lse_for_exp(lse5[:, :, :, q0:q1]).reshape(N, G * bq, 1)  # (.., bq) -> 3-D
    dqb = torch.zeros(N, G * bq, D, dtype=st.acc, device=qb.device)
    for ch in chunks:
        kc = k3[:, ch.k0:ch.k1].to(st.acc)  # (N, ck, D)
        vc = v3[:, ch.k0:ch.k1].to(st.acc)  # (N, ck, Dv)
        allowed = chunk_allowed(st, q0, q1, ch, qb.device) if ch.masked else None
        if allowed is not None and not st.finite:
            alive = alive_columns(st, allowed)
            kc, vc = torch.where(alive, kc, 0.0), torch.where(alive, vc, 0.0)
        s, t = chunk_scores(st, qb, kc, q0, q1, ch, allowed)  # (N, G·bq, ck)
        p = s.sub_(lse_b).exp_()  # the weights, in place of the scores
        dp = torch.bmm(dob, vc.transpose(1, 2))  # (N, G·bq, Dv) @ (N, Dv, ck) -> (N, G·bq, ck)
        pz = p
        if gen is not None:
            z = dropout_keep(st, gen, p.shape, qb.device)
            pz, dp = p * z, dp * z
        dv3[:, ch.k0:ch.k1].baddbmm_(pz.transpose(1, 2), dob)  # (N, ck, G·bq) @ (N, G·bq, Dv)
        ds = dp.sub_(delta).mul_(p)  # (N, G·bq, ck): P · (dP - δ), in place of dP
        if t is not None:
            ds.mul_(t.mul_(t).neg_().add_(1.0))  # d(softcap·tanh(x/softcap))/dx = 1 - tanh²
        dqb.baddbmm_(ds, kc)  # (N, G·bq, ck) @ (N, ck, D) -> (N, G·bq, D)
        # (N, ck, G·bq) @ (N, G·bq, D) -> (N, ck, D), times the scale
        dk3[:, ch.k0:ch.k1].baddbmm_(ds.transpose(1, 2), qb, alpha=st.scale)
    return (dqb * st.scale).view(st.B, st.Hkv, G, bq, D)  # (N, G·bq, D) -> 5-D
