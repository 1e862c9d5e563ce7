"""capture_attention: every layer's and head's attention for one text, as a ModelAttention."""

from __future__ import annotations

import numpy as np
import torch

from attnlab.errors import AttnlabError
from attnlab.explain.capture import ModelAttention


@torch.no_grad()
def capture_attention(model, ids: list[int], tokenizer=None) -> ModelAttention:
    """Run `model` (a GPT) on `ids` and return its attention in float64.

    weights (layers, H, L, S) are the weights the model used (recomputed next to the fused kernel
    from its log-sum-exp); queries (after rotary, before scaling), keys and values are per head
    with k/v heads repeated for GQA; mask is the causal (L, S) matrix. Tokens come from
    `tokenizer` or `model.tokenizer` (set by `load_checkpoint`), else the ids as strings.
    """
    ids = [int(i) for i in ids]
    if not ids:
        raise AttnlabError("ids: expected at least one token id, got none")
    if len(ids) > model.config.block_size:
        raise AttnlabError(f"ids: {len(ids)} tokens exceed the model's block_size "
                           f"{model.config.block_size}")
    if not all(0 <= i < model.config.vocab_size for i in ids):
        raise AttnlabError(f"ids: expected ids in 0..{model.config.vocab_size - 1}")
    was_training = model.training
    model.eval()
    records: list = []
    model(torch.tensor([ids]), record=records)
    model.train(was_training)
    groups = model.config.n_head // model.config.n_kv_head

    def per_head(x, repeat):  # (1, H|Hkv, T, D) -> (H, T, D) float64
        x = x[0].double()
        return x.repeat_interleave(groups, dim=0) if repeat else x

    stack = lambda xs: np.stack([x.numpy() for x in xs])  # noqa: E731
    L = len(ids)
    tok = tokenizer or getattr(model, "tokenizer", None)
    tokens = tok.tokens(tok.decode(ids)) if tok is not None else [str(i) for i in ids]
    return ModelAttention(
        tokens=tokens,
        weights=stack(r.weights[0].double() for r in records),  # (layers, H, L, S)
        mask=np.tril(np.ones((L, L), dtype=bool)),  # query i sees keys j <= i
        scale=float(records[0].scale),
        model_name=getattr(model, "name_or_path", None) or f"attnlab-gpt-{model.config.name}",
        causal=True,
        queries=stack(per_head(r.query, False) for r in records),  # (layers, H, L, D)
        keys=stack(per_head(r.key, True) for r in records),  # (layers, H, S, D)
        values=stack(per_head(r.value, True) for r in records),  # (layers, H, S, D)
    )
