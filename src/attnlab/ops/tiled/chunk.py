"""One chunk of the tiled kernel: its mask and scores, as the forward and the backward both
recompute them.

A chunk is (a block of bq query rows) × (a contiguous range of ck key columns). Its scores are
one batched matmul over N = B·Hkv, with the G query heads that share a key/value head stacked
along the rows, so grouped-query attention never copies k or v:

    s = (q @ kᵀ) · scale   # (N, G·bq, D) @ (N, D, ck) -> (N, G·bq, ck)

then softcap, ALiBi, the float `attn_mask` bias and the bool masks (only on chunks the plan
marks as masked), all through the one score pipeline (`ops.scores`) on the 5-D view
(B, Hkv, G, bq, ck). Everything is fp32 for fp16/bf16 inputs. The fused path gets the same
mask as a float bias (`fused_chunk`).
"""

from __future__ import annotations

import torch

from attnlab.ops import scores
from attnlab.ops.tiled.plan import Chunk
from attnlab.ops.tiled.setup import Setup, remember


def _flat_batch(t: torch.Tensor, st: Setup) -> torch.Tensor:
    """A mask's (Bm, ...) with Bm in {1, batch[-1]} as (1 | B, ...) over the flattened batch."""
    if t.shape[0] == 1 or len(st.batch) <= 1:
        return t
    t = t.expand(*st.batch, *t.shape[1:])  # (Bm, Hm, bq, ck) -> (*batch, Hm, bq, ck)
    return t.reshape(-1, *t.shape[len(st.batch):])  # -> (B, Hm, bq, ck)


def bias_chunk(st: Setup, q0: int, q1: int, ch: Chunk) -> torch.Tensor:
    """SDPA's attn_mask for rows q0:q1 and the chunk's keys (dims of size 1 stay broadcast)."""
    b = st.bias
    b = b[:, :, q0:q1] if b.shape[2] > 1 else b
    return b[:, :, :, ch.k0:ch.k1] if b.shape[3] > 1 else b  # (B|1, H|1, bq|1, ck|1)


def chunk_allowed(st: Setup, q0: int, q1: int, ch: Chunk, device) -> torch.Tensor | None:
    """bool (B|1, Hkv|1, G|1, bq, ck): which pairs of this chunk may attend (None = all)."""
    allowed = None
    key = ("allowed", q0, q1, ch.k0, ch.k1)
    if st.memo is not None and key in st.memo:
        return st.memo[key]
    if st.structured is not None:
        rows = torch.arange(q0, q1, device=device)
        cols = torch.arange(ch.k0, ch.k1, device=device)
        allowed = _flat_batch(st.structured.block(rows, cols, st.L, st.S), st)  # (Bm, Hm, bq, ck)
        if st.memo is not None:  # the mask alone: kept for the next call of this shape
            allowed = scores.heads5(allowed, st.Hkv, st.G)
            remember(st, key, allowed, allowed.numel())
            return allowed
    if st.bias is not None:
        b = bias_chunk(st, q0, q1, ch)
        b = b if b.dtype == torch.bool else b != float("-inf")
        allowed = b if allowed is None else allowed & b
    return None if allowed is None else scores.heads5(allowed, st.Hkv, st.G)


def alive_columns(st: Setup, allowed: torch.Tensor) -> torch.Tensor:
    """bool (N, ck, 1): key columns some row of this chunk may attend, per (batch, kv head).

    A column no row attends gets weight exactly 0, but 0 · NaN is NaN: its k and v are zeroed.
    """
    a = allowed.any(dim=-2).any(dim=2)  # (B|1, Hkv|1, G|1, bq, ck) -> (B|1, Hkv|1, ck)
    a = a.expand(st.B, st.Hkv, a.shape[-1])  # (B|1, Hkv|1, ck) -> (B, Hkv, ck)
    return a.reshape(st.B * st.Hkv, -1, 1)  # (B, Hkv, ck) -> (N, ck, 1)


def chunk_scores(st: Setup, qb: torch.Tensor, k: torch.Tensor, q0: int, q1: int, ch: Chunk,
                 allowed: torch.Tensor | None, grad: bool = False):
    """(s (N, G·bq, ck) scores, t = tanh(raw/softcap) or None for the softcap gradient,
    mod_vjp: ds -> ds through the score_mod, or None without one or without `grad`).

    qb: (N, G·bq, D) query rows and k: (N, ck, D) the chunk's keys, both in the accumulation dtype.
    """
    N, bq, ck = qb.shape[0], q1 - q0, ch.k1 - ch.k0
    s = scores.product(qb, k, st.scale)  # (N, G·bq, D) @ (N, D, ck) -> (N, G·bq, ck)
    mod_vjp = None
    if st.score_mod is not None:
        s, mod_vjp = _score_mod(st, s, q0, q1, ch, grad)
    rows = cols = None
    if st.slopes is not None:  # ALiBi needs the global positions i and j
        rows = torch.arange(q0, q1, device=s.device)
        cols = torch.arange(ch.k0, ch.k1, device=s.device)
    bias = None
    if st.bias is not None and st.bias.dtype != torch.bool:
        bias = scores.heads5(bias_chunk(st, q0, q1, ch), st.Hkv, st.G)  # (B|1, Hkv|1, G|1, bq, ck)
    s5, t = scores.modify(s.view(st.B, st.Hkv, st.G, bq, ck),  # (N, G·bq, ck) -> 5-D view
                          softcap=st.softcap, slopes=st.slopes, rows=rows, cols=cols, bias=bias,
                          allowed=allowed)
    s = s5.view(N, st.G * bq, ck)  # (B, Hkv, G, bq, ck) -> (N, G·bq, ck)
    return s, None if t is None else t.view(N, st.G * bq, ck), mod_vjp  # 5-D -> (N, G·bq, ck)


def _score_mod(st: Setup, s: torch.Tensor, q0: int, q1: int, ch: Chunk, grad: bool):
    """(score_mod(s) (N, G·bq, ck), its vector-Jacobian product or None) for one chunk; the
    heads of a key/value head are stacked along the rows, so (N, G·bq, ck) is (B, H, bq, ck)."""
    N, bq, ck = s.shape[0], q1 - q0, ch.k1 - ch.k0
    rows = torch.arange(q0, q1, device=s.device)
    cols = torch.arange(ch.k0, ch.k1, device=s.device)
    s4 = s.view(st.B, st.Hkv * st.G, bq, ck)  # (N, G·bq, ck) -> (B, H, bq, ck)
    if not grad:
        with torch.no_grad():
            return scores.apply_score_mod(st.score_mod, s4, rows, cols).view(N, -1, ck), None
    raw = s4.detach().requires_grad_(True)
    with torch.enable_grad():
        out = scores.apply_score_mod(st.score_mod, raw, rows, cols)  # (B, H, bq, ck)

    def vjp(ds: torch.Tensor) -> torch.Tensor:  # d(score_mod)ᵀ · ds, (N, G·bq, ck)
        g, *extra = torch.autograd.grad(out, (raw, *st.captured), ds.view_as(out),
                                        allow_unused=True)
        for i, e in enumerate(extra):  # the captured tensors' share of this chunk
            if e is not None:
                acc = st.captured_grads
                acc[i] = e if acc[i] is None else acc[i] + e
        return g.view(N, -1, ck)

    # a copy: the caller turns the scores into weights in place, and out's backward may read out
    return out.detach().clone().view(N, -1, ck), vjp


def fused_chunk(st: Setup, k, v, q0: int, q1: int, ch: Chunk, dtype):
    """The fused kernel's inputs for one chunk: (kc, vc (B, Hkv, ck, D|Dv) zeroed where no row
    attends, float bias (B|1, Hkv|1, G·bq, ck) or None, row liveness (B|1, Hkv|1, G·bq) or None)."""
    kc, vc = k[:, :, ch.k0:ch.k1], v[:, :, ch.k0:ch.k1]  # (B, Hkv, ck, D)
    if not ch.masked:
        return kc, vc, None, None
    key = (q0 - ch.k0, q1 - q0, ch.k1 - ch.k0)
    if st.shift_invariant and st.finite and key in st.cache:
        return kc, vc, *st.cache[key]  # the same diagonal offset has the same mask
    mkey = ("fused", q0, q1, ch.k0, ch.k1)
    if st.memo is not None and st.finite and mkey in st.memo:
        return kc, vc, *st.memo[mkey]  # this chunk of this mask, kept from an earlier call
    allowed = chunk_allowed(st, q0, q1, ch, k.device)  # (B|1, Hkv|1, G|1, bq, ck)
    if not st.finite:  # 0·NaN is NaN: zero the columns no row of this chunk attends
        alive = alive_columns(st, allowed).view(st.B, st.Hkv, -1, 1)  # (N, ck, 1) -> 4-D
        kc, vc = torch.where(alive, kc, 0), torch.where(alive, vc, 0)
    zero = torch.zeros((), dtype=dtype, device=k.device)
    bias = torch.where(allowed, zero, float("-inf"))  # (B|1, Hkv|1, G|1, bq, ck)
    if st.bias is not None and st.bias.dtype != torch.bool:
        bias = bias + scores.heads5(bias_chunk(st, q0, q1, ch), st.Hkv, st.G).to(dtype)
    (Bb, Hb), bq, ck = bias.shape[:2], q1 - q0, ch.k1 - ch.k0  # a mask may broadcast rows/cols
    bias = bias.expand(Bb, Hb, st.G, bq, ck).reshape(Bb, Hb, st.G * bq, ck)  # (.., G·bq, ck)
    rows = allowed.any(-1)  # (B|1, Hkv|1, G|1, bq|1)
    rows = rows.expand(*rows.shape[:2], st.G, bq)  # -> (B|1, Hkv|1, G, bq)
    row_alive = rows.reshape(*rows.shape[:2], st.G * bq)  # -> (B|1, Hkv|1, G·bq), kernel rows
    if st.shift_invariant:
        st.cache[key] = (bias, row_alive)
    elif st.memo is not None:
        remember(st, mkey, (bias, row_alive), bias.numel())
    return kc, vc, bias, row_alive


def q_rows(st: Setup, q5: torch.Tensor, q0: int, q1: int) -> torch.Tensor:
    """(B, Hkv, G, L, D) rows q0:q1 as (N, G·bq, D) in the accumulation dtype."""
    qb = q5[:, :, :, q0:q1].to(st.acc)  # (B, Hkv, G, bq, D)
    return qb.reshape(st.B * st.Hkv, st.G * (q1 - q0), -1)  # -> (N, G·bq, D)


def stacked_rows(st: Setup, x5: torch.Tensor, q0: int, q1: int) -> torch.Tensor:
    """(B, Hkv, G, L, E) rows q0:q1 as (B, Hkv, G·bq, E), the fused kernel's 4-D rows; a view
    when G = 1."""
    return x5[:, :, :, q0:q1].reshape(st.B, st.Hkv, st.G * (q1 - q0), x5.shape[-1])  # stack G
