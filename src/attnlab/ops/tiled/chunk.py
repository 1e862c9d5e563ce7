"""The scores of one chunk, as the tiled forward and backward both recompute them.

A chunk is (a block of bq query rows) × (a contiguous range of ck key columns). Its scores are one
batched matmul over N = B·Hkv, with the G query heads that share a key/value head stacked along
the rows, so grouped-query attention never copies k or v:

    s = (q @ kᵀ) · scale   # (N, G·bq, D) @ (N, D, ck) -> (N, G·bq, ck)

then softcap, ALiBi, the float `attn_mask` bias and the bool masks (only on chunks the plan marks
as masked), all through the one score pipeline (`ops.scores`) on the 5-D view (B, Hkv, G, bq, ck).
Everything is fp32 for fp16/bf16 inputs.
"""

from __future__ import annotations

import torch

from attnlab.ops import scores
from attnlab.ops.tiled.plan import Chunk
from attnlab.ops.tiled.setup import Setup


def _flat_batch(t: torch.Tensor, st: Setup) -> torch.Tensor:
    """A mask's (Bm, ...) with Bm in {1, batch[-1]} as (1 | B, ...) over the flattened batch."""
    if t.shape[0] == 1 or len(st.batch) <= 1:
        return t
    t = t.expand(*st.batch, *t.shape[1:])  # (Bm, Hm, bq, ck) -> (*batch, Hm, bq, ck)
    return t.reshape(-1, *t.shape[len(st.batch):])  # -> (B, Hm, bq, ck)


def heads5(t: torch.Tensor, st: Setup) -> torch.Tensor:
    """(B|1, H|1, a, b) -> (B|1, Hkv|1, G|1, a, b), matching the 5-D view of the scores."""
    if t.shape[1] == 1:
        return t[:, :, None]  # (B|1, 1, a, b) -> (B|1, 1, 1, a, b)
    return t.reshape(t.shape[0], st.Hkv, st.G, *t.shape[2:])  # (B|1, H, a, b) -> (.., Hkv, G, ..)


def bias_chunk(st: Setup, q0: int, q1: int, ch: Chunk) -> torch.Tensor:
    """SDPA's attn_mask for rows q0:q1 and the chunk's keys (dims of size 1 stay broadcast)."""
    b = st.bias
    b = b[:, :, q0:q1] if b.shape[2] > 1 else b
    return b[:, :, :, ch.k0:ch.k1] if b.shape[3] > 1 else b  # (B|1, H|1, bq|1, ck|1)


def chunk_allowed(st: Setup, q0: int, q1: int, ch: Chunk, device) -> torch.Tensor | None:
    """bool (B|1, Hkv|1, G|1, bq, ck): which pairs of this chunk may attend (None = all)."""
    allowed = None
    if st.structured is not None:
        rows = torch.arange(q0, q1, device=device)
        cols = torch.arange(ch.k0, ch.k1, device=device)
        allowed = _flat_batch(st.structured.block(rows, cols, st.L, st.S), st)  # (Bm, Hm, bq, ck)
    if st.bias is not None:
        b = bias_chunk(st, q0, q1, ch)
        b = b if b.dtype == torch.bool else b != float("-inf")
        allowed = b if allowed is None else allowed & b
    return None if allowed is None else heads5(allowed, st)


def chunk_scores(st: Setup, qb: torch.Tensor, k: torch.Tensor, q0: int, q1: int, ch: Chunk,
                 allowed: torch.Tensor | None):
    """(s (N, G·bq, ck) scores, t = tanh(raw/softcap) or None for the softcap gradient).

    qb: (N, G·bq, D) query rows and k: (N, ck, D) the chunk's keys, both in the accumulation dtype.
    """
    N, bq, ck = qb.shape[0], q1 - q0, ch.k1 - ch.k0
    s = scores.product(qb, k, st.scale)  # (N, G·bq, D) @ (N, D, ck) -> (N, G·bq, ck)
    rows = cols = None
    if st.slopes is not None:  # ALiBi needs the global positions i and j
        rows = torch.arange(q0, q1, device=s.device)
        cols = torch.arange(ch.k0, ch.k1, device=s.device)
    bias = None
    if st.bias is not None and st.bias.dtype != torch.bool:
        bias = heads5(bias_chunk(st, q0, q1, ch), st)  # (B|1, Hkv|1, G|1, bq|1, ck|1)
    s5, t = scores.modify(s.view(st.B, st.Hkv, st.G, bq, ck),  # (N, G·bq, ck) -> 5-D view
                          softcap=st.softcap, slopes=st.slopes, rows=rows, cols=cols, bias=bias,
                          allowed=allowed)
    s = s5.view(N, st.G * bq, ck)  # (B, Hkv, G, bq, ck) -> (N, G·bq, ck)
    return s, None if t is None else t.view(N, st.G * bq, ck)  # 5-D -> (N, G·bq, ck)


def alive_columns(st: Setup, allowed: torch.Tensor) -> torch.Tensor:
    """bool (N, ck, 1): key columns some row of this chunk may attend, per (batch, kv head).

    A column no row attends gets weight exactly 0, but 0 · NaN is NaN: its k and v are zeroed.
    """
    a = allowed.any(dim=-2).any(dim=2)  # (B|1, Hkv|1, G|1, bq, ck) -> (B|1, Hkv|1, ck)
    a = a.expand(st.B, st.Hkv, a.shape[-1])  # (B|1, Hkv|1, ck) -> (B, Hkv, ck)
    return a.reshape(st.B * st.Hkv, -1, 1)  # (B, Hkv, ck) -> (N, ck, 1)
