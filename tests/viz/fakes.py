"""Small ModelAttention captures built from random q, k, v (no model needed), for viz tests."""

from __future__ import annotations

import numpy as np

from attnlab.capture import ModelAttention
from attnlab.trace import trace

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
