"""The exact union of partial softmaxes through their log-sum-exp: one definition, used by the
tiled loop's fused chunks (`ops/tiled/fused.py`) and by context parallelism's blocks
(`distributed/attend.py`, `distributed/kernel_block.py`).

Two partial results over disjoint key sets, (out_a, lse_a) and (out_b, lse_b), give the result
over their union:

    lse = log(e^lse_a + e^lse_b);   out = e^(lse_a − lse)·out_a + e^(lse_b − lse)·out_b

A row that has seen nothing on either side (lse −inf on both) stays out 0, lse −inf: the shift
is 0 there (`scores.exp_shift`), so its weights are e^−inf = 0, never NaN. The arithmetic runs in
the lse's dtype (float32 for fp16/bf16 outputs, float64 for float64).
"""

from __future__ import annotations

import torch

from attnlab.ops.scores import exp_shift


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor):
    """(out (..., L, Dv) in the lse's dtype, lse (..., L)) of the union of two partial results."""
    lse, wa, wb = _weights(lse_a, lse_b)
    return out_a.to(wa.dtype) * wa + out_b.to(wa.dtype) * wb, lse


def merge_into(out: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor,
               lse_b: torch.Tensor) -> None:
    """`merge` written into (out, lse) in place (e.g. views of a call's result rows): no new
    buffer of the rows' size but the weights'."""
    total, wa, wb = _weights(lse, lse_b)
    out.mul_(wa)  # (..., L, Dv) · (..., L, 1)
    out.addcmul_(out_b, wb)
    lse.copy_(total)


def _weights(lse_a: torch.Tensor, lse_b: torch.Tensor):
    """(lse of the union (..., L), weight of a, weight of b (..., L, 1))."""
    lse = torch.logaddexp(lse_a, lse_b)
    shift = exp_shift(lse)
    return lse, torch.exp(lse_a - shift)[..., None], torch.exp(lse_b - shift)[..., None]
