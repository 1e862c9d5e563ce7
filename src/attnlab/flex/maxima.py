"""Flex's max_scores on the CPU: the largest modified, masked score of each query row.

torch returns it from its CUDA kernels (AuxRequest(max_scores=True)) and refuses it on the CPU.
attnlab recomputes it from the call's lse: a row's weights are w = exp(s - lse), so

    max_j s_ij = lse_i + log(max_j w_ij)

with the weights of WEIGHT_ROWS rows at a time (`ops.weights.rows_of`, the same score pipeline as
the forward), -inf for a row with nothing to attend. Cost: one more pass of L·S scores; no
gradient (torch's is not differentiable either).
"""

from __future__ import annotations

import torch

from attnlab.ops.api import WEIGHT_ROWS, make_problem
from attnlab.ops.weights import rows_of


@torch.no_grad()
def max_scores(query, key, value, lse, *, scale, enable_gqa, mask, **mods) -> torch.Tensor:
    """(B, H, L) in lse's dtype: each row's largest score after the modifiers and the mask;
    mods: the call's score_mod, or the softcap / alibi_slopes a score_mod was fused into."""
    p = make_problem(query, key, value, None, 0.0, False, scale, enable_gqa, mask=mask, **mods)
    L = p.dims.L
    out = torch.empty_like(lse)
    for r in range(0, L, WEIGHT_ROWS):
        idx = torch.arange(r, min(L, r + WEIGHT_ROWS), device=query.device)
        w = rows_of(p, lse, idx)  # (B, H, R, S)
        top = w.amax(-1) if w.shape[-1] else w.new_zeros(w.shape[:-1])  # (B, H, R)
        row = lse[..., r:r + idx.numel()]
        out[..., r:r + idx.numel()] = torch.where(top > 0, row + torch.log(top).to(row.dtype),
                                                  float("-inf"))
    return out
