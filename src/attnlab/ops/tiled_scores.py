"""The scores of one chunk, as the tiled forward and backward both recompute them.

A chunk is (a block of query rows) × (a contiguous range of key columns). Scores are computed for
all heads at once as one batched matmul over N = B·Hkv, with the G = H/Hkv query heads that share
a key/value head stacked along the rows, so grouped-query attention never copies k or v:

    s = (q·scale) @ kᵀ   # (N, G·bq, D) @ (N, D, ck) -> (N, G·bq, ck)

then, in order: tanh softcap, ALiBi bias, the float `attn_mask` bias, and the bool masks (only on
chunks the plan marks as masked). Everything is fp32 for fp16/bf16 inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnlab.masks import Mask
from attnlab.ops.math import accum_dtype
from attnlab.ops.problem import Problem
from attnlab.ops.tiled_plan import Chunk, Plan, make_plan


@dataclass
class Setup:
    """One call's inputs in the tiled kernels' layout, plus everything needed to redo a chunk."""

    B: int  # all batch dims flattened
    Hkv: int
    G: int  # query heads per key/value head
    L: int
    S: int
    batch: tuple[int, ...]
    scale: float
    acc: torch.dtype
    structured: Mask | None
    bias: torch.Tensor | None  # attn_mask as (B|1, H|1, L|1, S|1), bool or float
    softcap: float | None
    slopes: torch.Tensor | None  # ALiBi slopes as (1, Hkv, G, 1, 1), accumulation dtype
    dropout_p: float
    seed: int
    plan: Plan
    fused: bool  # inner step on PyTorch's fused flash kernel (tiled_fused) instead of pure ops
    finite: bool  # k and v hold no NaN/Inf: masked key columns need no zeroing
    shift_invariant: bool = False  # the mask depends only on i - j (causal, sliding window)
    cache: dict = field(default_factory=dict)  # chunk masks by diagonal offset and shape


def make_setup(p: Problem, fused: bool) -> Setup:
    d = p.dims
    B = 1
    for b in d.batch:
        B *= b
    acc = accum_dtype(p.query.dtype)
    slopes = p.alibi_slopes
    if slopes is not None:
        slopes = slopes.detach().to(p.query.device, acc).reshape(1, d.Hkv, d.groups, 1, 1)
    seed = int(torch.randint(0, 2**62, (1,)).item()) if p.dropout_p > 0 else 0
    return Setup(
        B=B, Hkv=d.Hkv, G=d.groups, L=d.L, S=d.S, batch=d.batch, scale=p.scale, acc=acc,
        structured=p.structured, bias=_bias4(p), softcap=p.softcap,
        slopes=slopes, dropout_p=p.dropout_p, seed=seed, plan=make_plan(p, fused=fused),
        fused=fused,
        finite=p.finite or (_all_finite(p.key) and _all_finite(p.value)),
        shift_invariant=(p.attn_mask is None and p.structured is not None
                         and p.structured.shift_invariant),
    )


def _all_finite(x: torch.Tensor) -> bool:
    """No NaN/Inf in x, from one reduction (an overflowing sum only costs the safe path)."""
    return bool(torch.isfinite(x.detach().sum()))


def _bias4(p: Problem) -> torch.Tensor | None:
    """SDPA's attn_mask as (B|1, H|1, L|1, S|1) with the batch dims flattened."""
    m = p.attn_mask
    if m is None:
        return None
    n = len(p.dims.scores_shape)
    while m.dim() > n:
        m = m[0]  # extra leading dims are 1 (checked at the boundary)
    m = m.reshape((1,) * (n - m.dim()) + tuple(m.shape))
    if p.dims.ndim == 2:
        return m[None, None]
    nb = len(p.dims.batch)
    if all(s == 1 for s in m.shape[:nb]):
        return m.reshape(1, *m.shape[nb:])
    return m.expand(*p.dims.batch, *m.shape[nb:]).reshape(-1, *m.shape[nb:])


def _flat_batch(t: torch.Tensor, st: Setup) -> torch.Tensor:
    """A mask's (Bm, ...) with Bm in {1, batch[-1]} as (1 | B, ...) over the flattened batch."""
    if t.shape[0] == 1 or len(st.batch) <= 1:
        return t
    return t.expand(*st.batch, *t.shape[1:]).reshape(-1, *t.shape[1:])


def heads5(t: torch.Tensor, st: Setup) -> torch.Tensor:
    """(B|1, H|1, a, b) -> (B|1, Hkv|1, G|1, a, b), matching the 5-D view of the scores."""
    if t.shape[1] == 1:
        return t[:, :, None]
    return t.reshape(t.shape[0], st.Hkv, st.G, *t.shape[2:])


def bias_chunk(st: Setup, q0: int, q1: int, ch: Chunk) -> torch.Tensor:
    """SDPA's attn_mask for rows q0:q1 and the chunk's keys (dims of size 1 stay broadcast)."""
    b = st.bias
    b = b[:, :, q0:q1] if b.shape[2] > 1 else b
    return b[:, :, :, ch.k0:ch.k1] if b.shape[3] > 1 else b


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


def chunk_scores(st: Setup, qs: torch.Tensor, k: torch.Tensor, q0: int, q1: int, ch: Chunk,
                 allowed: torch.Tensor | None):
    """(s (N, G·bq, ck) masked scores, t = tanh(raw/softcap) or None for the softcap gradient).

    qs: (N, G·bq, D), already multiplied by the scale; k: (N, ck, D) for this chunk.
    """
    N, bq, ck = qs.shape[0], q1 - q0, ch.k1 - ch.k0
    s = qs @ k.transpose(1, 2)  # (N, G·bq, D) @ (N, D, ck) -> (N, G·bq, ck)
    t = None
    if st.softcap is not None:
        t = torch.tanh(s / st.softcap)
        s = t * st.softcap
    s5 = s.view(st.B, st.Hkv, st.G, bq, ck)
    if st.slopes is not None:
        rows = torch.arange(q0, q1, device=s.device, dtype=s.dtype)
        cols = torch.arange(ch.k0, ch.k1, device=s.device, dtype=s.dtype)
        s5 += st.slopes * (cols[None, :] - rows[:, None])  # ALiBi: slope_h · (j - i)
    if st.bias is not None and st.bias.dtype != torch.bool:
        s5 += heads5(bias_chunk(st, q0, q1, ch).to(s.dtype), st)
    if allowed is not None:
        s5.masked_fill_(~allowed, float("-inf"))
    assert s.shape == (N, st.G * bq, ck)
    return s, t


def alive_columns(st: Setup, allowed: torch.Tensor) -> torch.Tensor:
    """bool (N, ck, 1): key columns some row of this chunk may attend, per (batch, kv head).

    A column no row attends gets weight exactly 0, but 0 · NaN is NaN: its k and v are zeroed.
    """
    a = allowed.any(dim=-2).any(dim=2)  # (B|1, Hkv|1, ck)
    a = a.expand(st.B, st.Hkv, a.shape[-1])
    return a.reshape(st.B * st.Hkv, -1, 1)


def dropout_keep(st: Setup, gen: torch.Generator, shape, device) -> torch.Tensor:
    """The survivors' multiplier (0 or 1/(1-p)); the backward replays the same generator."""
    keep = torch.rand(shape, generator=gen, device=device) >= st.dropout_p
    if st.dropout_p >= 1.0:  # every weight dropped (0/0 otherwise)
        return keep.to(st.acc)
    return keep.to(st.acc) / (1.0 - st.dropout_p)


def generator(st: Setup, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(st.seed)
