"""capture_attention: every layer's and head's attention for one text, as a ModelAttention."""

from __future__ import annotations

import torch

from attnlab.capture import ModelAttention
from attnlab.errors import AttnlabError


@torch.no_grad()
def capture_attention(model, ids: list[int], tokenizer=None) -> ModelAttention:
    """Run `model` (a GPT) on `ids` and return its attention in float64.

    weights (layers, H, L, S) are the weights the model used (recomputed next to the fused kernel
    from its log-sum-exp); queries (after rotary, before scaling), keys and values are per head
    with k/v heads repeated for GQA; mask is the causal (L, S) matrix. Built from the layers'
    records by `ModelAttention.from_calls`, like every other model's. Tokens come from
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
    tok = tokenizer or getattr(model, "tokenizer", None)
    tokens = tok.tokens(tok.decode(ids)) if tok is not None else [str(i) for i in ids]
    name = getattr(model, "name_or_path", None) or f"attnlab-gpt-{model.config.name}"
    return ModelAttention.from_calls(records, tokens, model_name=name)
