"""The backward of one (query rows, key block) pair (the forward of a block is
`attnlab.attention` itself; partial forwards merge through their lse in `ops/lse.py`).

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

With attention dropout (`dropout_forward`, `dropout_backward`) a block runs on plain PyTorch ops:
the fused kernels draw their own random numbers, while here the caller hands in the keyed mask
of the block's global rows × columns (`distributed.keyed`), so forward and backward drop the same
weights. Survivors are scaled by 1/(1 − p); the lse is the one before dropout.
"""

from __future__ import annotations

import torch

from attnlab.masks import Mask
from attnlab.ops import fused_cpu, nonfinite, scores, tiled
from attnlab.ops.kernels import runner
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


def block_backward(q, k, v, allowed, scale, softcap, out, lse, dout, dlse, *,
                   is_causal: bool = False):
    """(dq (B, H, Lb, D), dk (B, Hkv, Sb, D), dv (B, Hkv, Sb, Dv)) of one block, given the rows'
    global out (B, H, Lb, Dv), lse (B, H, Lb) and their gradients dout, dlse (or None).

    allowed: bool (Bm, Hm, Lb, Sb), True = may attend, or None (every pair of the block);
    is_causal: the block is top-left causal (query i sees keys j <= i), with allowed None.
    """
    if not isinstance(allowed, torch.Tensor):  # FULL, causal or structured: as one process
        structured = allowed if isinstance(allowed, Mask) else None
        p = make_problem(q, k, v, None, 0.0, is_causal, scale, q.shape[1] != k.shape[1],
                         mask=structured, softcap=softcap)
        if runner.applies(p):  # interval-shaped: the interval kernel's backward
            from attnlab.ops import kernels

            lo, hi = runner.intervals_of(p)
            if dlse is not None and not bool(dlse.any()):
                dlse = None
            return kernels.interval_backward(q, k, v, lo, hi, out, lse.float(), dout, dlse,
                                             scale=scale, softcap=softcap)
        if structured is not None:
            return tiled.backward(p, out, lse, dout, dlse)
    q, k, v = _sanitize(q, k, v, allowed)
    if _one_kernel_call(q, k, v, softcap):
        bias = None
        if allowed is not None:  # (Bm, Hm, Lb, Sb): 0 where allowed, -inf where masked
            bias = torch.zeros(allowed.shape, dtype=q.dtype).masked_fill(~allowed, float("-inf"))
        if dlse is not None and not bool(dlse.any()):
            dlse = None  # no extra column to carry
        return fused_cpu.backward(dout, q, k, v, out, lse, scale=scale, attn_mask=bias,
                                  is_causal=is_causal, dlse=dlse)
    p = make_problem(q, k, v, allowed, 0.0, is_causal, scale, q.shape[1] != k.shape[1],
                     mask=None, softcap=softcap)
    return tiled.backward(p, out, lse, dout, dlse)


def _cleaned(q, k, v, allowed, scale, softcap):
    """(k, v with NaN/Inf positions zeroed, the block's Problem, bad (B, Hkv, Sb) or None), by
    `ops.nonfinite` as in `attnlab.attention` (only with a mask: without one every row attends
    every key, so poison reaches every row anyway)."""
    p = make_problem(q, k, v, allowed, 0.0, False, scale, q.shape[1] != k.shape[1], mask=None,
                     softcap=softcap)
    p, bad = nonfinite.clean(p)
    return p.key, p.value, p, bad


def _grouped_scores(q, k, allowed, scale, softcap):
    """(s (B, Hkv, G, Lb, Sb) after softcap and mask, t = tanh(raw/softcap) or None)."""
    B, H, Lb, D = q.shape
    Hkv = k.shape[1]
    q5 = q.reshape(B, Hkv, H // Hkv, Lb, D)  # (B, H, Lb, D) -> (B, Hkv, G, Lb, D)
    s = scores.product(q5, k[:, :, None], scale)  # (B, Hkv, G, Lb, D) @ (B, Hkv, 1, D, Sb)
    return scores.modify(s, softcap=softcap, allowed=scores.heads5(allowed, Hkv, H // Hkv))


def dropout_forward(q, k, v, allowed, scale, softcap, keep, p: float):
    """(out (B, H, Lb, Dv), lse (B, H, Lb)) of one block whose weights survive where `keep`
    (bool (B, H, Lb, Sb)) is True, scaled by 1/(1 − p); lse is the one before dropout."""
    B, H, Lb, _ = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    k, v, prob, bad = _cleaned(q, k, v, allowed, scale, softcap)
    s, _ = _grouped_scores(q, k, allowed, scale, softcap)
    w, lse = scores.softmax(s)  # (B, Hkv, G, Lb, Sb), (B, Hkv, G, Lb)
    w = w.masked_fill_(~scores.heads5(keep, Hkv, H // Hkv), 0.0) / (1.0 - p)
    out = w @ v[:, :, None]  # (B, Hkv, G, Lb, Sb) @ (B, Hkv, 1, Sb, Dv) -> (B, Hkv, G, Lb, Dv)
    out, lse = out.reshape(B, H, Lb, Dv), lse.reshape(B, H, Lb)
    if bad is not None:  # rows that may attend a poisoned key are NaN, as attnlab.attention
        out, lse = nonfinite.poison(prob, bad, out, lse)
    return out, lse


def dropout_backward(q, k, v, allowed, scale, softcap, keep, p: float, out, lse, dout, dlse):
    """(dq, dk, dv) of one block under keyed dropout, given the rows' global out (after dropout),
    lse (before), and their gradients dout, dlse (or None).

    With P = exp(s − lse) and Z = keep/(1 − p): out = (P∘Z) @ v, so dv = (P∘Z)ᵀ @ dout and
    ds = P∘(Z∘(dout @ vᵀ) − rowsum(dout∘out) + dlse), through the softcap's tanh, times scale.
    """
    B, H, Lb, D = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    G = H // Hkv
    q, k, v = _sanitize(q, k, v, allowed)
    k, v, _, _ = _cleaned(q, k, v, allowed, scale, softcap)
    s, t = _grouped_scores(q, k, allowed, scale, softcap)
    lse5 = scores.lse_for_exp(lse).reshape(B, Hkv, G, Lb, 1)
    w = torch.exp(s - lse5)  # (B, Hkv, G, Lb, Sb): the global weights before dropout
    z = scores.heads5(keep, Hkv, G).to(w.dtype) / (1.0 - p)
    do5 = dout.reshape(B, Hkv, G, Lb, Dv)
    wz = w * z  # the weights as the forward applied them
    # (B, Hkv, G, Sb, Lb) @ (B, Hkv, G, Lb, Dv) -> summed over G: (B, Hkv, Sb, Dv)
    dv = (wz.transpose(-1, -2) @ do5).sum(2)
    dp = do5 @ v[:, :, None].transpose(-1, -2)  # (.., G, Lb, Dv) @ (.., 1, Dv, Sb) -> (.., Lb, Sb)
    delta = (do5 * out.reshape(B, Hkv, G, Lb, Dv)).sum(-1, keepdim=True)  # (B, Hkv, G, Lb, 1)
    if dlse is not None:
        delta = delta - dlse.reshape(B, Hkv, G, Lb, 1)
    ds = w * (dp * z - delta)
    if t is not None:
        ds = ds * (1 - t * t)
    ds = ds * scale
    dq = ds @ k[:, :, None]  # (B, Hkv, G, Lb, Sb) @ (B, Hkv, 1, Sb, D) -> (B, Hkv, G, Lb, D)
    dk = (ds.transpose(-1, -2) @ q.reshape(B, Hkv, G, Lb, D)).sum(2)  # -> (B, Hkv, Sb, D)
    return dq.reshape(B, H, Lb, D), dk, dv
