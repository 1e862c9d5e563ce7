"""The tiled kernel's inner step on PyTorch's fused CPU flash kernel, where it applies.

`aten._scaled_dot_product_flash_attention_for_cpu` computes one chunk (a block of query rows ×
a contiguous key range) in cache-sized tiles with fused exp/sum, and returns the chunk's lse;
partial results of several chunks merge exactly through their lse (`ops/lse.py`):

    lse = logaddexp(lse_a, lse_b);   out = out_a·exp(lse_a - lse) + out_b·exp(lse_b - lse)

Its backward, given the *global* out and lse, returns that chunk's exact share of dq, dk, dv
(P = exp(s - lse), δ = rowsum(dO·out)). So the plan decides which keys are visited (empty tiles
never are) and the fused kernel does the arithmetic; a masked chunk gets its own small float mask.

This file holds that arithmetic over one row block's chunks; the kernel (`kernel.py`,
`_fused_fwd_rows` / `_fused_bwd_rows`) prepares each chunk's keys, values and float mask
(`chunk.fused_chunk`) and is the only caller. Every call goes through `fused_cpu`, which owns
the kernel's layouts and lse conventions. Grouped heads are stacked along the rows (G·bq). No
dropout here: the kernel is used only without it (`fused_cpu.applies`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from attnlab.ops import fused_cpu
from attnlab.ops.lse import merge


def forward(qb: torch.Tensor, chunks: Iterable, *, scale: float):
    """(out (B, Hkv, G·bq, Dv), lse (B, Hkv, G·bq) fp32|fp64) of the rows qb (B, Hkv, G·bq, D)
    over their chunks, each given as (kc, vc (B, Hkv, ck, D|Dv), float mask (B|1, Hkv|1, G·bq, ck)
    or None, row liveness (B|1, Hkv|1, G·bq) or None). out is in q's dtype for one chunk, in the
    lse's dtype when chunks were merged."""
    out = lse = None
    for kc, vc, bias, row_alive in chunks:
        if bias is not None and bias.dtype != qb.dtype:  # kept from a call in another dtype
            bias = bias.to(qb.dtype)
        o, l = fused_cpu.forward(qb, kc, vc, attn_mask=bias, scale=scale,
                                 row_alive=row_alive)  # (B, Hkv, G·bq, Dv), (B, Hkv, G·bq)
        # merged in fp32 for fp16/bf16 (`ops.lse`)
        out, lse = (o, l) if out is None else merge(out, lse, o, l)
    return out, lse


def backward(dob, qb, ob, lb, chunks: Iterable, dk: torch.Tensor, dv: torch.Tensor, *,
             scale: float) -> torch.Tensor:
    """dq (B, Hkv, G·bq, D) in dk's dtype of the rows qb (B, Hkv, G·bq, D), given their global
    out ob and output gradient dob (B, Hkv, G·bq, Dv) and lse lb (B, Hkv, G·bq); adds each
    chunk's shares to dk (B, Hkv, S, D) and dv (B, Hkv, S, Dv). Chunks are given as (chunk, kc,
    vc, float mask or None), as `forward`'s with the chunk's key range in front."""
    dq = None
    for ch, kc, vc, bias in chunks:
        if bias is not None and bias.dtype != qb.dtype:  # the forward's, kept in its dtype
            bias = bias.to(qb.dtype)
        gq, gk, gv = fused_cpu.backward(dob, qb, kc, vc, ob, lb, attn_mask=bias, scale=scale)
        dq = gq.to(dk.dtype) if dq is None else dq + gq  # (B, Hkv, G·bq, D)
        dk[:, :, ch.k0:ch.k1] += gk  # (B, Hkv, ck, D)
        dv[:, :, ch.k0:ch.k1] += gv  # (B, Hkv, ck, Dv)
    return dq
