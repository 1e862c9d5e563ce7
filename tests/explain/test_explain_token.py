"""explain_token on hand-made ModelAttention objects: word lookup, ranking, detail table."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab import AttnlabError
from attnlab.capture import ModelAttention
from attnlab.explain.token import explain_token, find_word, positional_heads, rank_heads
from attnlab.tracing import trace

TOKENS = ["[CLS]", "the", "cat", "sat", "because", "it", "was", "ti", "##red", "[SEP]"]


def make_attention(seed=0, causal=False, layers=2, heads=3, D=4):
    """A random model run whose weights really are softmax(q k^T * scale) under the mask."""
    rng = np.random.default_rng(seed)
    L = len(TOKENS)
    q = rng.standard_normal((layers, heads, L, D)) * 2
    k = rng.standard_normal((layers, heads, L, D)) * 2
    v = rng.standard_normal((layers, heads, L, D))
    mask = np.tril(np.ones((L, L), bool)) if causal else np.ones((L, L), bool)
    w = trace(q, k, v, mask=mask).weights
    return ModelAttention(tokens=list(TOKENS), weights=w, mask=mask, scale=1 / np.sqrt(D),
                          model_name="toy", causal=causal, queries=q, keys=k, values=v)


def test_find_word_whole_tokens_pieces_and_indices():
    assert find_word(TOKENS, "it") == [5]
    assert find_word(TOKENS, "Cat") == [2]
    assert find_word(TOKENS, "tired") == [7, 8]
    assert find_word(TOKENS, "3") == [3] and find_word(TOKENS, "-1") == [9]
    chars = list("with it.")
    assert find_word(chars, "it") == [5, 6]  # the word, not the "it" inside "with"


def test_find_word_errors_list_the_tokens():
    with pytest.raises(AttnlabError, match=r"'dog': not in the text.*2:cat"):
        find_word(TOKENS, "dog")
    with pytest.raises(AttnlabError, match="out of range"):
        find_word(TOKENS, "42")


def test_report_schema_and_heads():
    att = make_attention()
    r = explain_token(att, "it", special={"[CLS]", "[SEP]"}, top=3).to_json()  # --json's schema
    assert r["tokens"] == TOKENS and r["focus"] == 5
    assert len(r["heads"]) == 6 and {"layer", "head", "weights"} <= set(r["heads"][0])
    np.testing.assert_allclose(r["heads"][4]["weights"], att.weights[1, 1, 5])
    d = r["detail"]
    for key in ("layer", "head", "scores", "scaled_scores", "weights", "mask", "contributions"):
        assert key in d
    l, h = d["layer"], d["head"]
    q, k = att.queries[l, h, 5], att.keys[l, h]
    np.testing.assert_allclose(d["scores"], k @ q)
    np.testing.assert_allclose(d["scaled_scores"], k @ q * att.scale)
    np.testing.assert_allclose(d["weights"], att.weights[l, h, 5], atol=1e-12)
    assert len(d["contributions"]) == 3
    shares = explain_token(att, "it", layer=l, head=h, top=99).detail.contributions
    assert sum(c.share for c in shares) == pytest.approx(1.0)  # the parts make the context


def test_top_ranked_head_is_the_strongest_non_special():
    att = make_attention(seed=3)
    special = {"[CLS]", "[SEP]"}
    r = explain_token(att, "it", special=special)
    w = att.weights[:, :, 5, :].copy()
    w[..., [0, 5, 9]] = -1  # not itself, not the special tokens
    skip = positional_heads(att, special)
    best = max(((l, h) for l in range(2) for h in range(3) if (l, h) not in skip),
               key=lambda lh: w[lh].max())
    assert (r.detail.layer, r.detail.head) == best
    assert rank_heads(att, 5, special)[0][:2] == best


def test_target_and_explicit_head():
    att = make_attention(seed=1)
    r = explain_token(att, "it", target="tired")
    total = att.weights[:, :, 5, 7] + att.weights[:, :, 5, 8]
    assert (r.detail.layer, r.detail.head) == np.unravel_index(total.argmax(),
                                                                           total.shape)
    r = explain_token(att, "it", layer=1, head=2)
    assert (r.detail.layer, r.detail.head) == (1, 2)
    with pytest.raises(AttnlabError, match=r"^head 3: out of range"):
        explain_token(att, "it", layer=1, head=3)
    with pytest.raises(AttnlabError, match="give both"):
        explain_token(att, "it", layer=1)


def test_positional_head_detected_and_left_out_of_ranking():
    att = make_attention(seed=2)
    L = len(TOKENS)
    prev = np.eye(L, k=-1)
    prev[0, 0] = 1
    att.weights[0, 0] = prev  # looks at the previous token, whatever it is
    assert positional_heads(att).get((0, 0)) == -1
    assert (0, 0) not in [(l, h) for l, h, _, _ in rank_heads(att, 5)]


def test_causal_split_word_uses_last_piece_and_masks_future():
    att = make_attention(seed=4, causal=True)
    r = explain_token(att, "tired", layer=0, head=0)
    assert r.pieces == [7, 8] and r.focus == 8
    r = explain_token(att, "it", layer=0, head=0)
    assert r.detail.mask == [True] * 6 + [False] * 4
    assert all(w == 0 for w in r.detail.weights[6:])
    assert [t.allowed for t in r.per_token] == r.detail.mask
