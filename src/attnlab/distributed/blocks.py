"""The backward of one (query rows, key block) pair, and the exact LSE merge of two partial
forwards (the forward of a block is `attnlab.attention` itself).

Inputs are already in the accumulation dtype (float32, float64 for float64 inputs). Grouped-query
attention runs without copying k/v per head: the G = H / Hkv query heads that share a key head are
laid side by side as G·Lb rows of one matmul.

The backward takes the *global* output and log-sum-exp of the rows (saved by the forward), so a
block's weights are recomputed exactly, p = exp(s − lse), without any L×S state.

Semantics kept from `attnlab.attention`: a row that may attend nothing has output 0 and lse −inf;
NaN/Inf in a key, value or query that no pair of this block uses never reaches a result.
"""

from __future__ import annotations

import torch

from attnlab.ops import fused_cpu, scores


def _grouped(x: torch.Tensor, Hkv: int) -> torch.Tensor:
    B, H, Lb, D = x.shape
    return x.reshape(B, Hkv, (H // Hkv) * Lb, D)  # (B, H, Lb, D) -> (B, Hkv, G·Lb, D)


def _ungrouped(x: torch.Tensor, H: int) -> torch.Tensor:
    B, Hkv, GL, X = x.shape
    return x.reshape(B, H, GL * Hkv // H, X)  # (B, Hkv, G·Lb, X) -> (B, H, Lb, X)


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


def _scores(q, k, scale, softcap, allowed):
    """(scores with -inf where masked, tanh of the capped scores or None), (B, H, Lb, Sb), through
    the op's one score pipeline (`ops.scores`)."""
    H, Hkv = q.shape[1], k.shape[1]
    # (B, Hkv, G·Lb, D) @ (B, Hkv, D, Sb) -> (B, Hkv, G·Lb, Sb) -> (B, H, Lb, Sb)
    s = _ungrouped(scores.product(_grouped(q, Hkv), k, scale), H)
    return scores.modify(s, softcap=softcap, allowed=allowed)


def _fused_ok(q, k, v, softcap, dlse) -> bool:
    """PyTorch's CPU flash backward (`ops.fused_cpu`) takes the global out and lse as they are; it
    knows no softcap, no lse gradient and no grouped heads, and it wants equal head dims."""
    return (fused_cpu.available(q.device) and q.dtype in fused_cpu.DTYPES and softcap is None
            and q.shape[1] == k.shape[1] and q.shape[-1] == v.shape[-1]
            and q.shape[2] > 0 and not bool(dlse.any()))


def _fused_backward(q, k, v, allowed, scale, out, lse, dout):
    bias = None
    if allowed is not None:  # (Bm, Hm, Lb, Sb): 0 where allowed, -inf where masked
        bias = torch.zeros(allowed.shape, dtype=q.dtype).masked_fill(~allowed, float("-inf"))
    return fused_cpu.backward(dout, q, k, v, out, lse, scale=scale, attn_mask=bias)


def block_backward(q, k, v, allowed, scale, softcap, out, lse, dout, dlse):
    """(dq (B, H, Lb, D), dk (B, Hkv, Sb, D), dv (B, Hkv, Sb, Dv)) of one block, given the rows'
    global out (B, H, Lb, Dv), lse (B, H, Lb) and their gradients dout, dlse."""
    q, k, v = _sanitize(q, k, v, allowed)
    if _fused_ok(q, k, v, softcap, dlse):
        return _fused_backward(q, k, v, allowed, scale, out, lse, dout)
    H, Hkv = q.shape[1], k.shape[1]
    s, t = _scores(q, k, scale, softcap, allowed)
    p = s.sub_(scores.lse_for_exp(lse)[..., None]).exp_()  # (B, H, Lb, Sb) - (B, H, Lb, 1)
    # (B, Hkv, G·Lb, Dv) @ (B, Hkv, Dv, Sb) -> (B, H, Lb, Sb)
    dp = _ungrouped(_grouped(dout, Hkv) @ v.transpose(-1, -2), H)
    delta = (dout * out).sum(-1, keepdim=True) - dlse[..., None]  # (B, H, Lb, 1)
    ds = dp.sub_(delta).mul_(p)  # d(capped, masked scores), in place of dp
    if t is not None:
        ds.mul_(1 - t * t)
    ds.mul_(scale)
    # (B, Hkv, G·Lb, Sb) @ (B, Hkv, Sb, D) -> (B, H, Lb, D)
    dq = _ungrouped(_grouped(ds, Hkv) @ k, H)
    # (B, Hkv, Sb, G·Lb) @ (B, Hkv, G·Lb, D|Dv) -> (B, Hkv, Sb, D|Dv): summed over the group
    dk = _grouped(ds, Hkv).transpose(-1, -2) @ _grouped(q, Hkv)
    dv = _grouped(p, Hkv).transpose(-1, -2) @ _grouped(dout, Hkv)
    return dq, dk, dv


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
