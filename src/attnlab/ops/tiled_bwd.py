"""Tiled backward: recompute each chunk's weights from the saved lse, never store them.

With P = exp(s - lse) (the softmax weights), Z the dropout multiplier and dO the output gradient:

    dV = (P·Z)ᵀ @ dO;   dP = (dO @ Vᵀ)·Z;   dS = P · (dP - δ),  δ = rowsum(dO · out)
    dQ = scale · dS @ K;  dK = dSᵀ @ (scale · Q)

(δ equals rowsum(P·dP) because out = (P·Z) @ V.) Softcap multiplies dS by 1 - tanh². Rows with
lse = -inf (nothing to attend) get P = 0 and so gradient 0. dK and dV accumulate in the
accumulation dtype over (N, S, D) buffers; per query block only one chunk of scores is alive.
"""

from __future__ import annotations

import torch

from attnlab.ops import tiled_fused
from attnlab.ops.tiled_fwd import q_block
from attnlab.ops.tiled_scores import (
    Setup,
    alive_columns,
    chunk_allowed,
    chunk_scores,
    dropout_keep,
    generator,
)


def _bwd(st: Setup, q, k, v, out, lse, dout):
    """Gradients (dq, dk, dv) in the inputs' dtypes; shapes as `_fwd`'s inputs."""
    N, G, D, Dv = st.B * st.Hkv, st.G, q.shape[-1], v.shape[-1]
    q5 = q.reshape(st.B, st.Hkv, G, st.L, D)
    do5 = dout.reshape(st.B, st.Hkv, G, st.L, Dv)
    dq = torch.zeros(st.B, st.Hkv, G, st.L, D, dtype=q.dtype, device=q.device)
    dk = torch.zeros(N, st.S, D, dtype=st.acc, device=q.device)
    dv = torch.zeros(N, st.S, Dv, dtype=st.acc, device=q.device)
    if st.fused:
        dk4, dv4 = dk.view(st.B, st.Hkv, st.S, D), dv.view(st.B, st.Hkv, st.S, Dv)
        out5 = out.reshape(st.B, st.Hkv, G, st.L, Dv)
        lse5 = lse.reshape(st.B, st.Hkv, G, st.L)
        for q0, q1, chunks in st.plan.rows:
            if chunks:
                g = tiled_fused.bwd_rows(st, q5, k, v, out5, lse5, do5, q0, q1, chunks, dk4, dv4)
                dq[:, :, :, q0:q1] = g.view(st.B, st.Hkv, G, q1 - q0, D)
        return dq.view(q.shape), dk.view(k.shape).to(k.dtype), dv.view(v.shape).to(v.dtype)
    k3, v3 = k.reshape(N, st.S, D), v.reshape(N, st.S, Dv)
    delta = (dout.to(st.acc) * out.to(st.acc)).sum(-1)  # (B, H, L)
    delta5 = delta.reshape(st.B, st.Hkv, G, st.L)
    # a row with nothing to attend: lse -inf; +inf makes exp(s - lse) = 0 there, not NaN
    lse5 = torch.where(lse == float("-inf"), float("inf"), lse).reshape(st.B, st.Hkv, G, st.L)
    gen = generator(st, q.device) if st.dropout_p > 0 else None
    for q0, q1, chunks in st.plan.rows:
        if not chunks:
            continue
        bq = q1 - q0
        qs = q_block(st, q5, q0, q1)  # (N, G·bq, D), scaled
        dob = do5[:, :, :, q0:q1].to(st.acc).reshape(N, G * bq, Dv)
        lse_b = lse5[:, :, :, q0:q1].reshape(N, G * bq, 1)
        delta_b = delta5[:, :, :, q0:q1].reshape(N, G * bq, 1)
        dqb = torch.zeros(N, G * bq, D, dtype=st.acc, device=q.device)
        for ch in chunks:
            kc = k3[:, ch.k0:ch.k1].to(st.acc)  # (N, ck, D)
            vc = v3[:, ch.k0:ch.k1].to(st.acc)  # (N, ck, Dv)
            allowed = chunk_allowed(st, q0, q1, ch, q.device) if ch.masked else None
            if allowed is not None and not st.finite:
                alive = alive_columns(st, allowed)
                kc, vc = torch.where(alive, kc, 0.0), torch.where(alive, vc, 0.0)
            s, t = chunk_scores(st, qs, kc, q0, q1, ch, allowed)  # (N, G·bq, ck)
            p = torch.exp(s - lse_b)
            dp = dob @ vc.transpose(1, 2)  # (N, G·bq, Dv) @ (N, Dv, ck) -> (N, G·bq, ck)
            if gen is not None:
                z = dropout_keep(st, gen, p.shape, q.device)
                pz = p * z
                dp = dp * z
            else:
                pz = p
            dv[:, ch.k0:ch.k1] += pz.transpose(1, 2) @ dob  # (N, ck, G·bq) @ (N, G·bq, Dv)
            ds = p * (dp - delta_b)
            if t is not None:
                ds = ds * (1.0 - t * t)  # d(softcap·tanh(x/softcap))/dx
            dqb += ds @ kc  # (N, G·bq, ck) @ (N, ck, D) -> (N, G·bq, D)
            dk[:, ch.k0:ch.k1] += ds.transpose(1, 2) @ qs  # (N, ck, G·bq) @ (N, G·bq, D)
        dq[:, :, :, q0:q1] = (dqb * st.scale).view(st.B, st.Hkv, G, bq, D).to(q.dtype)
    return (
        dq.view(q.shape),
        dk.view(k.shape).to(k.dtype),
        dv.view(v.shape).to(v.dtype),
    )
