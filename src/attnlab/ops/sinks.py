"""Learned attention sinks (GPT-OSS): one extra logit per head in each row's softmax.

With sink logit t_h for head h, a row's weights become

    w_ij = exp(s_ij) / (exp(t_h) + Σ_j exp(s_ij))

and nothing is borrowed for the sink (it has no value): the sink takes its share of the mass
and the output shrinks by it. The sink is not scaled and no score modifier or mask touches it.

Every backend computes the row's output `out` and log-sum-exp `lse` without the sink; the sink
then joins exactly, from those two alone:

    lse' = logaddexp(lse, t_h)          out' = out · exp(lse - lse')

since w'_ij = exp(s_ij - lse') = w_ij · exp(lse - lse'). Both are differentiable, so autograd
through them, on top of each backend's own gradient of out and lse, gives the gradients of q, k,
v and t. The lse returned is lse' (the sink included), so exact weights recomputed from it,
exp(s - lse'), are the sink's weights (they sum to 1 - exp(t_h - lse')).

A row with nothing to attend (lse = -inf) gets lse' = t_h, output 0, gradient 0 to q, k and v
and d(t_h) = its lse gradient: the sink takes all the mass, as transformers' eager GPT-OSS
attention gives. Never NaN (unless the row's own inputs are NaN, which stays visible).
"""

from __future__ import annotations

import torch

from attnlab.ops import scores
from attnlab.ops.problem import Problem

#: output dtypes whose join of the (..., H, L) statistics runs in float64 (the sinks' gradient is
#: a sum over every row: in float32 it loses a few ulps more than a plain implementation's);
#: the output itself is scaled in its accumulation dtype
WIDE = {torch.float32: True}


def attach(p: Problem, out: torch.Tensor, lse: torch.Tensor):
    """(out' (..., H, L, Dv) in out's dtype, lse' (..., H, L) in lse's dtype) of the call with
    the sinks p.sinks (H,), given its out and lse without them (see the module docstring)."""
    acc = torch.float64 if lse.dtype == torch.float64 or WIDE.get(out.dtype) else lse.dtype
    t = p.sinks.to(acc)
    t = t[:, None] if p.dims.ndim > 2 else t[0]  # (H,) -> (H, 1): broadcast over (..., H, L)
    new = torch.logaddexp(lse.to(acc), t)  # (..., H, L)
    keep = torch.exp(lse.to(acc) - new)  # (..., H, L): the share of the mass left to the keys
    keep = keep.to(scores.accum_dtype(out.dtype))  # out itself is scaled in its own precision
    out = (out.to(keep.dtype) * keep[..., None]).to(out.dtype)  # (..., H, L, Dv)
    return out, new.to(lse.dtype)
