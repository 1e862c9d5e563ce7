"""Tiled forward: online softmax over the plan's chunks, never more than one chunk of scores.

For each query block, a running row max m, row sum l and unnormalised output acc are carried
across the chunks (FlashAttention's recurrence):

    m' = max(m, rowmax(s));  p = exp(s - m');  l' = l·exp(m - m') + rowsum(p)
    acc' = acc·exp(m - m') + p @ v;            out = acc / l;  lse = m + log(l)

Rows that may attend to nothing keep m = -inf; the max is replaced by 0 for the exponent so they
end with l = 0, output 0 and lse -inf, never NaN. Extra memory: one chunk of scores plus the
(B, H, L) statistics, i.e. linear in L.
"""

from __future__ import annotations

import torch

from attnlab.ops import tiled_fused
from attnlab.ops.tiled_scores import (
    Setup,
    alive_columns,
    chunk_allowed,
    chunk_scores,
    dropout_keep,
    generator,
)


def q_block(st: Setup, q5: torch.Tensor, q0: int, q1: int) -> torch.Tensor:
    """(B, Hkv, G, L, D) rows q0:q1 as (N, G·bq, D) in the accumulation dtype."""
    qb = q5[:, :, :, q0:q1].to(st.acc) * st.scale  # scaled after the upcast: no bf16 rounding
    return qb.reshape(st.B * st.Hkv, st.G * (q1 - q0), -1)


def _fwd(st: Setup, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """q (B, H, L, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv) -> (out (B, H, L, Dv) in q's dtype,
    lse (B, H, L) in the accumulation dtype)."""
    N, G, Dv = st.B * st.Hkv, st.G, v.shape[-1]
    q5 = q.reshape(st.B, st.Hkv, G, st.L, q.shape[-1])  # (B, H, L, D) -> (B, Hkv, G, L, D)
    k3 = k.reshape(N, st.S, -1)  # (N, S, D)
    v3 = v.reshape(N, st.S, Dv)  # (N, S, Dv)
    out = torch.zeros(st.B, st.Hkv, G, st.L, Dv, dtype=q.dtype, device=q.device)
    lse = torch.full((st.B, st.Hkv, G, st.L), float("-inf"), dtype=st.acc, device=q.device)
    if st.fused:
        for q0, q1, chunks in st.plan.rows:
            if chunks:  # no chunks: every pair masked, output stays 0 and lse -inf
                o, lb = tiled_fused.fwd_rows(st, q5, k, v, q0, q1, chunks)
                out[:, :, :, q0:q1] = o.view(st.B, st.Hkv, G, q1 - q0, Dv)
                lse[:, :, :, q0:q1] = lb.view(st.B, st.Hkv, G, q1 - q0)
    else:
        gen = generator(st, q.device) if st.dropout_p > 0 else None
        for q0, q1, chunks in st.plan.rows:
            if chunks:
                o, lb = _pure_rows(st, q5, k3, v3, q0, q1, chunks, gen)
                out[:, :, :, q0:q1] = o.to(q.dtype)
                lse[:, :, :, q0:q1] = lb
    return out.view(st.B, st.Hkv * G, st.L, Dv), lse.view(st.B, st.Hkv * G, st.L)


def _pure_rows(st: Setup, q5, k3, v3, q0, q1, chunks, gen):
    """Online softmax over one row block's chunks with plain PyTorch ops.

    Returns (out (B, Hkv, G, bq, Dv), lse (B, Hkv, G, bq)), both in the accumulation dtype."""
    N, Dv, bq = st.B * st.Hkv, v3.shape[-1], q1 - q0
    qs = q_block(st, q5, q0, q1)  # (N, G·bq, D)
    m = torch.full((N, qs.shape[1], 1), float("-inf"), dtype=st.acc, device=qs.device)
    l = torch.zeros_like(m)  # (N, G·bq, 1)
    acc = torch.zeros(N, qs.shape[1], Dv, dtype=st.acc, device=qs.device)
    for ch in chunks:
        kc = k3[:, ch.k0:ch.k1].to(st.acc)  # (N, ck, D)
        vc = v3[:, ch.k0:ch.k1].to(st.acc)  # (N, ck, Dv)
        allowed = chunk_allowed(st, q0, q1, ch, qs.device) if ch.masked else None
        if allowed is not None and not st.finite:  # 0·NaN is NaN: zero unattended columns
            vc = torch.where(alive_columns(st, allowed), vc, 0.0)
        s, _ = chunk_scores(st, qs, kc, q0, q1, ch, allowed)  # (N, G·bq, ck)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)
        p = torch.exp(s - m_safe)
        alpha = torch.exp(m - m_safe)  # 0 on the first chunk
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        if gen is not None:
            p = p * dropout_keep(st, gen, p.shape, qs.device)
        acc = torch.baddbmm(acc * alpha, p, vc)  # (N, G·bq, ck) @ (N, ck, Dv)
        m = m_new
    out = acc / torch.where(l > 0, l, 1.0)
    m_safe = torch.where(m == float("-inf"), 0.0, m)
    lse = m_safe + torch.log(l)
    return out.view(st.B, st.Hkv, st.G, bq, Dv), lse.view(st.B, st.Hkv, st.G, bq)
