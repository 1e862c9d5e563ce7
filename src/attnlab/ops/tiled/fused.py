"""The tiled kernel's inner step on PyTorch's fused CPU flash kernel, where it applies.

`aten._scaled_dot_product_flash_attention_for_cpu` computes one chunk (a block of query rows ×
a contiguous key range) in cache-sized tiles with fused exp/sum, and returns the chunk's lse;
partial results of several chunks merge exactly through their lse:

    lse = logaddexp(lse_a, lse_b);   out = out_a·exp(lse_a - lse) + out_b·exp(lse_b - lse)

Its backward, given the *global* out and lse, returns that chunk's exact share of dq, dk, dv
(P = exp(s - lse), δ = rowsum(dO·out)). So the plan decides which keys are visited (empty tiles
never are) and the fused kernel does the arithmetic; a masked chunk gets its own small float mask.

Used where `fused_cpu.applies` (the pure PyTorch chunk loop in `tiled.fwd`/`tiled.bwd` covers
the rest); every call goes through `fused_cpu`, which owns the kernel's layouts and lse
conventions. Grouped heads are stacked along the rows. No dropout here (the kernel is only used
without it), so the generator argument the dispatchers pass is always None.
"""

from __future__ import annotations

import torch

from attnlab.ops import fused_cpu, scores
from attnlab.ops.tiled.chunk import alive_columns, bias_chunk, chunk_allowed, heads5
from attnlab.ops.tiled.setup import Setup


def _rows(st: Setup, x5: torch.Tensor, q0: int, q1: int) -> torch.Tensor:
    """(B, Hkv, G, L, E) rows q0:q1 as (B, Hkv, G·bq, E); a view when G = 1."""
    return x5[:, :, :, q0:q1].reshape(st.B, st.Hkv, st.G * (q1 - q0), x5.shape[-1])  # stack G


def _chunk_inputs(st: Setup, k, v, q0, q1, ch, dtype):
    """k, v of the chunk (zeroed where no row attends), its float mask and row liveness or None."""
    kc, vc = k[:, :, ch.k0:ch.k1], v[:, :, ch.k0:ch.k1]  # (B, Hkv, ck, D)
    if not ch.masked:
        return kc, vc, None, None
    key = (q0 - ch.k0, q1 - q0, ch.k1 - ch.k0)
    if st.shift_invariant and st.finite and key in st.cache:
        return kc, vc, *st.cache[key]  # the same diagonal offset has the same mask
    allowed = chunk_allowed(st, q0, q1, ch, k.device)  # (B|1, Hkv|1, G|1, bq, ck)
    if not st.finite:  # 0·NaN is NaN: zero the columns no row of this chunk attends
        alive = alive_columns(st, allowed).view(st.B, st.Hkv, -1, 1)  # (N, ck, 1) -> 4-D
        kc, vc = torch.where(alive, kc, 0), torch.where(alive, vc, 0)
    zero = torch.zeros((), dtype=dtype, device=k.device)
    bias = torch.where(allowed, zero, float("-inf"))  # (B|1, Hkv|1, G|1, bq, ck)
    if st.bias is not None and st.bias.dtype != torch.bool:
        bias = bias + heads5(bias_chunk(st, q0, q1, ch), st).to(dtype)
    (Bb, Hb), bq, ck = bias.shape[:2], q1 - q0, ch.k1 - ch.k0  # a mask may broadcast rows/cols
    bias = bias.expand(Bb, Hb, st.G, bq, ck).reshape(Bb, Hb, st.G * bq, ck)  # (.., G·bq, ck)
    rows = allowed.any(-1)  # (B|1, Hkv|1, G|1, bq|1)
    rows = rows.expand(*rows.shape[:2], st.G, bq)  # -> (B|1, Hkv|1, G, bq)
    row_alive = rows.reshape(*rows.shape[:2], st.G * bq)  # -> (B|1, Hkv|1, G·bq), kernel rows
    if st.shift_invariant:
        st.cache[key] = (bias, row_alive)
    return kc, vc, bias, row_alive


def fwd_rows(st: Setup, q5, k, v, q0, q1, chunks, gen=None):
    """(out (B, Hkv, G, bq, Dv), lse (B, Hkv, G, bq) fp32|fp64) for one row block; out is in q's
    dtype for one chunk, in the lse's dtype when chunks were merged."""
    qb = _rows(st, q5, q0, q1)  # (B, Hkv, G·bq, D)
    out = lse = None
    for ch in chunks:
        kc, vc, bias, row_alive = _chunk_inputs(st, k, v, q0, q1, ch, q5.dtype)
        o, l = fused_cpu.forward(qb, kc, vc, attn_mask=bias, scale=st.scale,
                                 row_alive=row_alive)  # (B, Hkv, G·bq, Dv), (B, Hkv, G·bq)
        if out is None:
            out, lse = o, l
            continue
        new = torch.logaddexp(lse, l)
        safe = scores.exp_shift(new)
        wa, wb = torch.exp(lse - safe)[..., None], torch.exp(l - safe)[..., None]  # (.., G·bq, 1)
        out = out.to(wa.dtype) * wa + o.to(wa.dtype) * wb  # merged in fp32 for fp16/bf16
        lse = new
    bq = q1 - q0
    out = out.view(st.B, st.Hkv, st.G, bq, -1)  # (B, Hkv, G·bq, Dv) -> (B, Hkv, G, bq, Dv)
    return out, lse.view(st.B, st.Hkv, st.G, bq)  # (B, Hkv, G·bq) -> (B, Hkv, G, bq)


def bwd_rows(st: Setup, q5, k, v, out5, lse5, do5, q0, q1, chunks, dk, dv, gen=None, dlse5=None):
    """dq rows (B, Hkv, G, bq, D) in the accumulation dtype; adds this block's shares to dk
    (B, Hkv, S, D) and dv (B, Hkv, S, Dv). An lse gradient arrives folded into the inputs'
    extra columns (`fused_cpu.with_lse_grad`, by `tiled.bwd._bwd`), so dlse5 is always None."""
    qb, ob, dob = _rows(st, q5, q0, q1), _rows(st, out5, q0, q1), _rows(st, do5, q0, q1)
    lb = lse5[:, :, :, q0:q1].reshape(st.B, st.Hkv, -1)  # (B, Hkv, G, bq) -> (B, Hkv, G·bq)
    dq = None
    for ch in chunks:
        kc, vc, bias, _ = _chunk_inputs(st, k, v, q0, q1, ch, q5.dtype)
        gq, gk, gv = fused_cpu.backward(dob, qb, kc, vc, ob, lb, attn_mask=bias, scale=st.scale)
        dq = gq.to(dk.dtype) if dq is None else dq + gq  # (B, Hkv, G·bq, D)
        dk[:, :, ch.k0:ch.k1] += gk  # (B, Hkv, ck, D)
        dv[:, :, ch.k0:ch.k1] += gv  # (B, Hkv, ck, Dv)
    return dq.view(st.B, st.Hkv, st.G, q1 - q0, -1)  # (B, Hkv, G·bq, D) -> (B, Hkv, G, bq, D)
