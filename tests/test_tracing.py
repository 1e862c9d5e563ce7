"""trace: the lesson's worked numbers as a golden test, input kinds, batched traces."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import attnlab
from attnlab import masks

from helpers import assert_close

IT, KEYS = [[2, 1]], [[3, 1], [0, 4], [1, 1]]  # the lesson's query for "it"; cat, mat, because


def test_lesson_scores_7_4_3():
    t = attnlab.trace(IT, KEYS, np.eye(3), scale=1.0, tokens=["cat", "mat", "because"])
    assert t.scores.tolist() == [[7.0, 4.0, 3.0]]
    w = t.weights[0]
    e = np.exp([7.0, 4.0, 3.0])
    assert np.allclose(w, e / e.sum()) and w.argmax() == 0
    assert np.allclose(t.output[0], w)  # identity values: the context is the weights
    assert np.isclose(t.lse[0], np.log(e.sum()))


def test_default_scale_is_one_over_sqrt_d():
    t = attnlab.trace(IT, KEYS, KEYS)
    assert np.isclose(t.scale, 1 / np.sqrt(2))
    assert np.allclose(t.scaled_scores, t.scores / np.sqrt(2))


@pytest.mark.parametrize("convert", [lambda x: x, np.asarray, lambda x: torch.tensor(x).float()])
def test_accepts_lists_numpy_torch(convert):
    t = attnlab.trace(convert(IT), convert(KEYS), convert(KEYS), scale=1.0)
    assert t.scores.dtype == np.float64 and t.scores.tolist() == [[7.0, 4.0, 3.0]]


def test_masked_steps():
    q = np.random.default_rng(0).normal(size=(4, 3))
    t = attnlab.trace(q, q, q, mask=masks.causal())
    assert t.mask.shape == (4, 4)
    assert np.isneginf(t.masked_scores[0, 1:]).all()
    assert np.allclose(np.triu(t.weights, 1), 0)


def test_batched_matches_attention():
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=torch.float64) for _ in range(3))
    t = attnlab.trace(q, k, v, mask=masks.causal())
    out, lse = attnlab.attention(q, k, v, is_causal=True, return_lse=True, backend="math")
    assert_close(t.output, out, atol=1e-12)
    assert_close(t.lse, lse, atol=1e-12)


def test_to_dict_is_json():
    t = attnlab.trace(IT, KEYS, KEYS, mask=[[True, False, True]], tokens=["cat", "mat", "because"])
    d = json.loads(json.dumps(t.to_dict()))
    assert d["masked_scores"][0][1] is None and d["tokens"] == ["cat", "mat", "because"]
    assert d["mask"] == [[True, False, True]]


def test_a_mask_function_reading_b_and_h_is_traced_at_every_b_and_h():
    """Issue 35 item 1 in the trace: the mask is the call's, never b = h = 0 only."""

    def checker(b, h, q, k):
        return ((q + k + b + h) % 2 == 0) | (q == k)

    q = torch.randn(2, 3, 5, 4)
    t = attnlab.trace(q, q, q, mask=masks.from_function(checker))
    i, j = np.arange(5)[:, None], np.arange(5)[None, :]
    for b in range(2):
        for h in range(3):
            assert (t.mask[b, h] == (((i + j + b + h) % 2 == 0) | (i == j))).all()
