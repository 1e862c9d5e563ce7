"""repr() of the records stays one short line: the arrays inside would print 100k characters."""

from __future__ import annotations

import numpy as np
import torch

import attnlab
from attnlab.capture import AttentionCall, ModelAttention


def _att(L=40, layers=6, heads=12):
    w = np.full((layers, heads, L, L), 1.0 / L)
    return ModelAttention(tokens=[f"t{i}" for i in range(L)], weights=w,
                          mask=np.ones((L, L), bool), scale=0.125, model_name="toy",
                          causal=False, queries=np.zeros((layers, heads, L, 8)),
                          keys=np.zeros((layers, heads, L, 8)),
                          values=np.zeros((layers, heads, L, 8)))


def test_model_attention_repr_is_one_short_line():
    r = repr(_att())
    assert r == "ModelAttention('toy', 40 tokens, 6 layers x 12 heads, causal=False, with q, k, v)"


def test_attention_call_repr_names_shapes_not_values():
    q = torch.zeros(1, 2, 50, 4)
    call = AttentionCall(layer=3, query=q, key=q, value=q,
                         allowed=torch.ones(1, 1, 50, 50, dtype=torch.bool),
                         weights=torch.zeros(1, 2, 50, 50), scale=0.5, causal=True)
    assert repr(call) == ("AttentionCall(layer=3, query (1, 2, 50, 4), key (1, 2, 50, 4), "
                          "value (1, 2, 50, 4), scale=0.5, causal=True, cross=False)")


def test_trace_repr_is_short():
    t = attnlab.trace(np.ones((30, 4)), np.ones((30, 4)), np.ones((30, 4)))
    assert len(repr(t)) < 120 and "\n" not in repr(t)
