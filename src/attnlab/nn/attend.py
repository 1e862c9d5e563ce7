"""Attention output from the fast kernel, and the weights next to it without a slow path.

When weights are wanted, `attend` validates the call once into a Problem and runs it with
`attnlab.ops.api.run_with_weights`: the fast kernel computes the output and the log-sum-exp of
every row, and the weights are recomputed from it with that Problem's scale and masks
(w = exp(s - lse): one matmul and one exp, no second softmax). torch.nn.MultiheadAttention instead
falls back to its math path when need_weights=True.
Caution: the weights are the probabilities before dropout.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from attnlab.ops.api import attention, make_problem, run_with_weights


class Attended(NamedTuple):
    out: torch.Tensor  # (B, H, L, Dv)
    weights: torch.Tensor | None  # (B, H, L, S), or None when not asked for
    scale: float | None  # the scale the scores used (None when no weights were asked for)


def attend(q, k, v, *, need_weights: bool = False, attn_mask=None, mask=None,
           is_causal: bool = False, dropout_p: float = 0.0, kernel=None) -> Attended:
    """(out (B, H, L, D), weights (B, H, L, S) or None, scale) for q (B, H, L, D), k/v (B, Hkv,
    S, D).

    `kernel` replaces `attnlab.attention` (same arguments) when no weights are wanted; the
    benchmark uses it to time a peer.
    """
    gqa = q.shape[-3] != k.shape[-3]
    if not need_weights:
        fn = kernel or attention
        out = fn(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                 enable_gqa=gqa, mask=mask)
        return Attended(out, None, None)
    p = make_problem(q, k, v, attn_mask, dropout_p, is_causal, None, gqa, mask=mask)
    out, _, w = run_with_weights(p)
    return Attended(out, w, p.scale)
