"""The lesson past one head, on real models: q, k, v from x, the heads concatenated through W_o,
the residual and the layer norms, and positions; every number against the model's own forward in
float64 (the target: 1e-6; float64 arithmetic gives ~1e-15)."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.errors import AttnlabError
from attnlab.explain.layer import layer_walk, rotary_angles
from attnlab.explain.model import load_model, run_model

SENTENCE = "The cat sat on the mat because it was tired."
TOL = 1e-6


def _gpt(tmp_path_factory, name, **overrides):
    from attnlab.models import Trainer

    out = tmp_path_factory.mktemp(name) / "run"
    Trainer.start("tiny", out=out, max_steps=20, eval_interval=20, batch_size=8, eval_batches=1,
                  model_overrides={"n_layer": 2, "n_embd": 32, "block_size": 48,
                                   **overrides}).run()
    return load_model(str(out))


@pytest.fixture(scope="module")
def minilm_walk():
    return layer_walk(load_model(None), SENTENCE, layer=2, head=8, token="it")


def test_minilm_layer_agrees_with_its_forward(minilm_walk):
    w = minilm_walk
    assert w.tokens[w.token] == "it" and (w.d_model, w.n_heads, w.head_dim) == (384, 12, 32)
    assert set(w.checks) == {"q", "k", "v", "attention_output", "layer_output"}
    assert max(w.checks.values()) < TOL, w.checks
    # the head's weights are the ones the capture holds (the model runs in float32 there): 76.7%
    att = run_model(SENTENCE)
    np.testing.assert_allclose(w.weights, att.weights[2, 8, w.token], atol=2e-6)
    assert round(100 * w.weights[w.tokens.index("tired")], 1) == 76.7
    np.testing.assert_allclose(w.q, att.queries[2, 8, w.token], atol=1e-4)
    # concatenation: head h's context sits at columns h·D..(h+1)·D
    np.testing.assert_allclose(w.concat[8 * 32:9 * 32], w.contexts[8])


def test_minilm_positions_and_the_previous_token_head(minilm_walk):
    p = minilm_walk.positions
    assert p.kind == "learned" and p.x0_error < TOL
    # words taken out, positions alone: layer 0 head 2 still scores the previous position highest
    assert p.prev_head["head"] == 2 and p.prev_head["hits"] == p.prev_head["rows"] == 12


def test_trained_tiny_gpt_layer_agrees_with_its_forward(tmp_path_factory):
    loaded = _gpt(tmp_path_factory, "tiny")
    for layer in (0, 1):
        w = layer_walk(loaded, "ROMEO: the king", layer=layer, head=1, token=6)
        assert w.norm == "pre" and max(w.checks.values()) < TOL, (layer, w.checks)
        assert abs(sum(w.weights) - 1) < 1e-12 and all(x == 0 for x in w.weights[w.token + 1:])
    assert w.positions.kind == "learned"
    assert layer_walk(loaded, "ROMEO", layer=0, head=0, token=2).positions.x0_error < TOL


def test_rotary_gqa_gpt_and_the_rotation_depends_on_distance(tmp_path_factory):
    loaded = _gpt(tmp_path_factory, "rope", rotary=True, n_kv_head=2)
    w = layer_walk(loaded, "the king, the king", layer=1, head=3, token=9)
    assert max(w.checks.values()) < TOL, w.checks
    p = w.positions
    assert p.kind == "rotary" and p.shift == 5
    assert abs(p.rotary_dots[0] - p.rotary_dots[1]) < 1e-12  # moved together: the same q·k
    np.testing.assert_allclose(rotary_angles([3], 4, 10000.0)[0], [3, 0.03, 3, 0.03])


def test_bad_arguments():
    with pytest.raises(AttnlabError, match=r"^layer 6: out of range"):
        layer_walk(load_model(None), SENTENCE, layer=6, head=0, token="it")
    with pytest.raises(AttnlabError, match=r"^token 'dog': not in the text"):
        layer_walk(load_model(None), SENTENCE, layer=0, head=0, token="dog")
