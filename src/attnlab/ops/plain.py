"""Backend "math": attention as plain PyTorch ops, autograd by PyTorch.

Builds the full (..., H, L, S) score matrix, so memory is quadratic in length; it is the readable,
exact path and the fallback for every mask. Low-precision inputs are computed in float32. The
scores come from the one score pipeline (`ops.scores`).

(The module is `plain`, not `math`, so it never shadows the standard library's `math`; the backend
keeps its public name "math".)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.ops import scores
from attnlab.ops.problem import Problem
from attnlab.ops.scores import accum_dtype

__all__ = ["accum_dtype", "forward", "score_matrix"]


def score_matrix(p: Problem, allowed, bias) -> torch.Tensor:
    """Scaled, modified, masked scores (..., H, L, S) in the accumulation dtype."""
    acc = accum_dtype(p.query.dtype)
    q, k = p.query.to(acc), p.key.to(acc)
    d = p.dims
    if d.groups > 1:
        k = k.repeat_interleave(d.groups, dim=-3)  # (..., Hkv, S, D) -> (..., H, S, D)
    s = scores.product(q, k, p.scale)  # (..., H, L, D) @ (..., H, D, S) -> (..., H, L, S)
    if p.score_mod is not None:
        ar = torch.arange
        s4 = s.reshape(-1, d.H if d.ndim > 2 else 1, d.L, d.S)  # (..., H, L, S) -> (B, H, L, S)
        s = scores.apply_score_mod(p.score_mod, s4, ar(d.L, device=q.device),
                                   ar(d.S, device=q.device)).reshape(s.shape)
    rows = cols = None
    if p.alibi_slopes is not None:  # ALiBi needs the positions i and j
        rows, cols = torch.arange(d.L, device=q.device), torch.arange(d.S, device=q.device)
    s, _ = scores.modify(s, softcap=p.softcap,
                         slopes=scores.head_slopes(p.alibi_slopes, d.ndim, acc),
                         rows=rows, cols=cols, bias=bias, allowed=allowed)
    return s


def forward(p: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (..., H, L, Dv) in the input dtype, lse (..., H, L) in the accumulation dtype)."""
    allowed, bias = p.dense_masks()
    # NaN/Inf in key/value was handled before any backend (ops.nonfinite)
    w, lse = scores.softmax(score_matrix(p, allowed, bias))
    if p.dropout_p > 0:
        w = F.dropout(w, p.dropout_p, training=True)
    v = p.value.to(w.dtype)
    if p.dims.groups > 1:
        v = v.repeat_interleave(p.dims.groups, dim=-3)  # (..., Hkv, S, Dv) -> (..., H, S, Dv)
    out = w @ v  # (..., H, L, S) @ (..., H, S, Dv) -> (..., H, L, Dv)
    return out.to(p.query.dtype), lse
