"""Tiled forward: online softmax over the plan's chunks, never more than one chunk of scores.

For each query block, a running row max m, row sum l and unnormalised output acc are carried
across the chunks (FlashAttention's recurrence):

    m' = max(m, rowmax(s));  p = exp(s - m');  l' = l·exp(m - m') + rowsum(p)
    acc' = acc·exp(m - m') + p @ v;            out = acc / l;  lse = m + log(l)

Rows that may attend to nothing keep m = -inf; the shift of the exponent is 0 for them
(`scores.exp_shift`) so they end with l = 0, output 0 and lse -inf, never NaN. Extra memory: one
chunk of scores plus the (B, H, L) statistics, i.e. linear in L.

`_fwd` is the dispatcher (one row block at a time, on the fused path `tiled.fused` or the pure
PyTorch path `_pure_rows` here).
"""

from __future__ import annotations

import torch

from attnlab.ops import scores
from attnlab.ops.tiled import fused
from attnlab.ops.tiled.chunk import alive_columns, chunk_allowed, chunk_scores
from attnlab.ops.tiled.setup import Setup, dropout_keep, generator


def q_rows(st: Setup, q5: torch.Tensor, q0: int, q1: int) -> torch.Tensor:
    """(B, Hkv, G, L, D) rows q0:q1 as (N, G·bq, D) in the accumulation dtype."""
    qb = q5[:, :, :, q0:q1].to(st.acc)  # (B, Hkv, G, bq, D)
    return qb.reshape(st.B * st.Hkv, st.G * (q1 - q0), -1)  # -> (N, G·bq, D)


def _fwd(st: Setup, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """q (B, H, L, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv) -> (out (B, H, L, Dv) in q's dtype,
    lse (B, H, L) in the accumulation dtype)."""
    G, Dv = st.G, v.shape[-1]
    q5 = q.reshape(st.B, st.Hkv, G, st.L, q.shape[-1])  # (B, H, L, D) -> (B, Hkv, G, L, D)
    out = torch.zeros(st.B, st.Hkv, G, st.L, Dv, dtype=q.dtype, device=q.device)
    lse = torch.full((st.B, st.Hkv, G, st.L), float("-inf"), dtype=st.acc, device=q.device)
    rows = fused.fwd_rows if st.fused else _pure_rows
    gen = generator(st, q.device)
    for q0, q1, chunks in st.plan.rows:
        if chunks:  # no chunks: every pair masked, output stays 0 and lse -inf
            o, lb = rows(st, q5, k, v, q0, q1, chunks, gen)  # (B, Hkv, G, bq, Dv), (.., G, bq)
            out[:, :, :, q0:q1] = o
            lse[:, :, :, q0:q1] = lb
    out = out.view(st.B, st.Hkv * G, st.L, Dv)  # (B, Hkv, G, L, Dv) -> (B, H, L, Dv)
    return out, lse.view(st.B, st.Hkv * G, st.L)  # (B, Hkv, G, L) -> (B, H, L)


def _pure_rows(st: Setup, q5, k, v, q0, q1, chunks, gen):
    """Online softmax over one row block's chunks with plain PyTorch ops.

    Returns (out (B, Hkv, G, bq, Dv), lse (B, Hkv, G, bq)), both in the accumulation dtype."""
    N, Dv, bq = st.B * st.Hkv, v.shape[-1], q1 - q0
    k3 = k.reshape(N, st.S, -1)  # (B, Hkv, S, D) -> (N, S, D)
    v3 = v.reshape(N, st.S, Dv)  # (B, Hkv, S, Dv) -> (N, S, Dv)
    qb = q_rows(st, q5, q0, q1)  # (N, G·bq, D)
    m = torch.full((N, qb.shape[1], 1), float("-inf"), dtype=st.acc, device=qb.device)
    l = torch.zeros_like(m)  # (N, G·bq, 1)
    acc = torch.zeros(N, qb.shape[1], Dv, dtype=st.acc, device=qb.device)  # (N, G·bq, Dv)
    for ch in chunks:
        kc = k3[:, ch.k0:ch.k1].to(st.acc)  # (N, ck, D)
        vc = v3[:, ch.k0:ch.k1].to(st.acc)  # (N, ck, Dv)
        allowed = chunk_allowed(st, q0, q1, ch, qb.device) if ch.masked else None
        if allowed is not None and not st.finite:  # 0·NaN is NaN: zero unattended columns
            vc = torch.where(alive_columns(st, allowed), vc, 0.0)
        s, _ = chunk_scores(st, qb, kc, q0, q1, ch, allowed)  # (N, G·bq, ck)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (N, G·bq, 1)
        shift = scores.exp_shift(m_new)
        p = torch.exp(s - shift)  # (N, G·bq, ck)
        alpha = torch.exp(m - shift)  # 0 on the first chunk
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        if gen is not None:
            p = p * dropout_keep(st, gen, p.shape, qb.device)
        acc = torch.baddbmm(acc * alpha, p, vc)  # (N, G·bq, ck) @ (N, ck, Dv) -> (N, G·bq, Dv)
        m = m_new
    out = acc / torch.where(l > 0, l, 1.0)
    lse = scores.exp_shift(m) + torch.log(l)  # (N, G·bq, 1); log(0) = -inf: nothing to attend
    out = out.view(st.B, st.Hkv, st.G, bq, Dv)  # (N, G·bq, Dv) -> (B, Hkv, G, bq, Dv)
    return out, lse.view(st.B, st.Hkv, st.G, bq)  # (N, G·bq, 1) -> (B, Hkv, G, bq)
