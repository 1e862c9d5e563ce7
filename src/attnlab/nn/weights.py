"""Attention output from the fast kernel, and the weights next to it without a slow path.

When weights are wanted, `attend` asks `attnlab.attention` for the log-sum-exp of every row too
and recomputes the weights from it with `attnlab.attention_weights` (w = exp(s - lse): one matmul
and one exp, no second softmax). The output still comes from the fused kernel, whereas
torch.nn.MultiheadAttention falls back to its math path when need_weights=True.
Caution: the weights are the probabilities before dropout.
"""

from __future__ import annotations

import attnlab


def attend(q, k, v, *, need_weights: bool = False, attn_mask=None, mask=None,
           is_causal: bool = False, dropout_p: float = 0.0, kernel=None):
    """(out (B, H, L, D), weights (B, H, L, S) or None) for q (B, H, L, D), k/v (B, Hkv, S, D).

    `kernel` replaces `attnlab.attention` (same arguments) when no weights are wanted; the
    benchmark uses it to time a peer.
    """
    gqa = q.shape[-3] != k.shape[-3]
    kw = {"attn_mask": attn_mask, "is_causal": is_causal, "enable_gqa": gqa, "mask": mask}
    if not need_weights:
        fn = kernel or attnlab.attention
        return fn(q, k, v, dropout_p=dropout_p, **kw), None
    out, lse = attnlab.attention(q, k, v, dropout_p=dropout_p, return_lse=True, **kw)
    return out, attnlab.attention_weights(q, k, lse, **kw)
