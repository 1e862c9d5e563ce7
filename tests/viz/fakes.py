"""Small ModelAttention captures built from random q, k, v (no model needed), for viz tests."""

from __future__ import annotations

import numpy as np

from attnlab.capture import ModelAttention
from attnlab.tracing import trace

XSS = "<img src=x onerror=alert(1)>"


def fake_capture(tokens, n_layers=2, n_heads=3, d=8, causal=True, seed=0, qkv=True,
                 model_name="fake-model") -> ModelAttention:
    """Attention of random heads over `tokens`, computed by attnlab.trace (so weights are exact)."""
    rng = np.random.default_rng(seed)
    n = len(tokens)
    q = rng.normal(size=(n_layers, n_heads, n, d)) * 2.0  # (layers, H, L, D)
    k = rng.normal(size=(n_layers, n_heads, n, d))        # (layers, H, S, D)
    v = rng.normal(size=(n_layers, n_heads, n, d))        # (layers, H, S, Dv)
    mask = np.tril(np.ones((n, n), dtype=bool)) if causal else np.ones((n, n), dtype=bool)
    t = trace(q, k, v, mask=mask)
    return ModelAttention(tokens=list(tokens), weights=t.weights.astype(np.float32), mask=mask,
                          scale=t.scale, model_name=model_name, causal=causal,
                          queries=q.astype(np.float32) if qkv else None,
                          keys=k.astype(np.float32) if qkv else None,
                          values=v.astype(np.float32) if qkv else None)


def fake_tokenize(text: str) -> list[str]:
    """Words, but an <...> tag stays one token (so the XSS sentence keeps its tag intact)."""
    import re

    return re.findall(r"<[^>]*>|[^\s<]+", text)


class FakeModels:
    """load/run pair for attnlab.viz.app.Models that counts loads and runs, without torch models."""

    def __init__(self):
        self.loads, self.runs = [], 0

    def load(self, path):
        self.loads.append(path)
        return {"name": path or "default"}

    def run(self, text, loaded):
        self.runs += 1
        tokens = fake_tokenize(text)
        return fake_capture(tokens, n_layers=2, n_heads=3, seed=len(tokens),
                            model_name=loaded["name"])


def recorded_capture(arch: str, n: int = 8) -> ModelAttention:
    """A tiny random transformers model run through attnlab on `n` token ids, as a capture:
    "gemma2" (layer 0 a 4-token sliding window, layer 1 full, scores softcapped at 1.0) or
    "t5" (T5's encoder: a learned position bias added to the scores)."""
    import torch
    from transformers import Gemma2Config, Gemma2Model, T5Config, T5EncoderModel

    from attnlab.adapters import hf, recording

    hf.register()
    torch.manual_seed(0)
    if arch == "gemma2":
        model = Gemma2Model(Gemma2Config(
            vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=32,
            sliding_window=4, attn_logit_softcapping=1.0, query_pre_attn_scalar=8,
            initializer_range=0.2, attn_implementation=hf.NAME))
    else:
        model = T5EncoderModel(T5Config(
            vocab_size=50, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8, dropout_rate=0.0, attn_implementation=hf.NAME))
    with torch.no_grad(), recording.record() as calls:
        model.eval()(input_ids=torch.arange(3, 3 + n)[None])
    return ModelAttention.from_calls(calls, [f"t{i}" for i in range(n)], model_name=arch)
