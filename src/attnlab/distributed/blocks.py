"""The backward of one (query rows, key block) pair, and the exact LSE merge of two partial
forwards (the forward of a block is `attnlab.attention` itself).

Inputs are already in the accumulation dtype (float32, float64 for float64 inputs).

The backward takes the *global* output and log-sum-exp of the rows (saved by the forward) and
their gradients, and runs attnlab's tiled backward on the block (`ops.tiled.backward`): each
chunk's weights are recomputed exactly, p = exp(s − lse), without any L×S state; on CPU the
chunks go to PyTorch's flash backward wherever it applies (grouped heads stacked along the rows,
so k/v are never copied per head; an lse gradient folded in as one more column), softcap runs on
plain PyTorch chunks.

Semantics kept from `attnlab.attention`: a row that may attend nothing has output 0 and lse −inf;
NaN/Inf in a key, value or query that no pair of this block uses never reaches a result.
"""

from __future__ import annotations

import torch

from attnlab.ops import tiled
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


def block_backward(q, k, v, allowed, scale, softcap, out, lse, dout, dlse):
    """(dq (B, H, Lb, D), dk (B, Hkv, Sb, D), dv (B, Hkv, Sb, Dv)) of one block, given the rows'
    global out (B, H, Lb, Dv), lse (B, H, Lb) and their gradients dout, dlse (or None).

    allowed: bool (Bm, Hm, Lb, Sb), True = may attend, or None (every pair of the block).
    """
    q, k, v = _sanitize(q, k, v, allowed)
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
