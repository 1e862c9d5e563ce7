"""The backward of one (query rows, key block) pair, and the exact LSE merge of two partial
forwards (the forward of a block is `attnlab.attention` itself).

Inputs are already in the accumulation dtype (float32, float64 for float64 inputs).

The backward takes the *global* output and log-sum-exp of the rows (saved by the forward) and
their gradients, so a block's weights are recomputed exactly, p = exp(s − lse), without any L×S
state. Equal query and key/value heads without softcap: one call of PyTorch's CPU flash backward
over the block (`ops.fused_cpu`, which folds an lse gradient in as one more column). Everything
else — grouped heads, softcap, other devices — runs attnlab's tiled backward on the block
(`ops.tiled.backward`): empty tiles skipped, the G query heads of a key/value head stacked along
the rows so k/v are never copied per head, chunks on the flash kernel where it applies (GQA) and
on plain PyTorch ops otherwise (softcap).

Semantics kept from `attnlab.attention`: a row that may attend nothing has output 0 and lse −inf;
NaN/Inf in a key, value or query that no pair of this block uses never reaches a result.
"""

from __future__ import annotations

import torch

from attnlab.ops import fused_cpu, tiled
from attnlab.ops.validate import make_problem


def _sanitize(q, k, v, allowed):
    """Zero the keys/values no row of the block may attend and the rows that attend nothing."""
    if allowed is None:
        return q, k, v
    Hkv, H = k.shape[1], q.shape[1]
    dead_k = ~allowed.any(-2)  # (Bm, Hm, Sb)
    if dead_k.shape[1] == H and Hkv != H:  # per-head mask: dead only if dead for the whole group
        dead_k = dead_k.reshape(dead_k.shape[0], Hkv, H // Hkv, -1).all(2)  # (Bm, Hkv, Sb)
    dead_q = ~allowed.any(-1)  # (Bm, Hm, Lb)
    zero = torch.zeros((), dtype=q.dtype)
    return (torch.where(dead_q[..., None], zero, q), torch.where(dead_k[..., None], zero, k),
            torch.where(dead_k[..., None], zero, v))


def _one_kernel_call(q, k, v, softcap) -> bool:
    """The block is one call of the CPU flash backward: equal heads and head dims, no softcap
    (`benchmarks/block_backward.py`: one call over a block of 512 × 1024 is no slower than the
    tiled plan there; grouped heads go to the tiled plan, which stacks them along the rows)."""
    return (fused_cpu.available(q.device) and q.dtype in fused_cpu.DTYPES and softcap is None
            and q.shape[1] == k.shape[1] and q.shape[-1] == v.shape[-1] and q.shape[2] > 0)


def block_backward(q, k, v, allowed, scale, softcap, out, lse, dout, dlse):
    """(dq (B, H, Lb, D), dk (B, Hkv, Sb, D), dv (B, Hkv, Sb, Dv)) of one block, given the rows'
    global out (B, H, Lb, Dv), lse (B, H, Lb) and their gradients dout, dlse (or None).

    allowed: bool (Bm, Hm, Lb, Sb), True = may attend, or None (every pair of the block).
    """
    q, k, v = _sanitize(q, k, v, allowed)
    if _one_kernel_call(q, k, v, softcap):
        bias = None
        if allowed is not None:  # (Bm, Hm, Lb, Sb): 0 where allowed, -inf where masked
            bias = torch.zeros(allowed.shape, dtype=q.dtype).masked_fill(~allowed, float("-inf"))
        if dlse is not None and not bool(dlse.any()):
            dlse = None  # no extra column to carry
        return fused_cpu.backward(dout, q, k, v, out, lse, scale=scale, attn_mask=bias, dlse=dlse)
    p = make_problem(q, k, v, allowed, 0.0, False, scale, q.shape[1] != k.shape[1], mask=None,
                     softcap=softcap)
    return tiled.backward(p, out, lse, dout, dlse)


def merge(out_a, lse_a, out_b, lse_b):
    """Exact union of two partial softmaxes over disjoint key sets, through their log-sum-exp.

    lse = log(e^lse_a + e^lse_b); out = e^(lse_a − lse)·out_a + e^(lse_b − lse)·out_b. Rows that
    have seen nothing yet (lse −inf) take weight 0, never NaN.
    """
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    wa = torch.exp(lse_a - safe)[..., None]  # (B, H, Lb, 1)
    wb = torch.exp(lse_b - safe)[..., None]
    return wa * out_a + wb * out_b, lse
