"""head_stats on hand-built weights with known answers (every statistic), then on MiniLM."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnlab import AttnlabError
from attnlab.capture import ModelAttention
from attnlab.explain.head_statistics import STATS, head_stats, is_punct, looks_special, text_stats


def att(weights, tokens, mask=None, name="toy"):
    w = np.asarray(weights, dtype=float)
    if w.ndim == 2:
        w = w[None, None]
    L = w.shape[-1]
    m = np.ones((L, L), bool) if mask is None else np.asarray(mask, bool)
    return ModelAttention(tokens=list(tokens), weights=w, mask=m, scale=1.0, model_name=name,
                          causal=not np.triu(m, 1).any())


def uniform(mask):
    m = np.asarray(mask, float)
    return m / m.sum(-1, keepdims=True)


TOKS = ["a", "b", "c", "d", "e"]


def test_identity_is_self_with_zero_entropy():
    s = head_stats(att(np.eye(5), TOKS))
    assert s["self"][0, 0] == 1 and s["entropy"][0, 0] == 0 and s["entropy_norm"][0, 0] == 0
    assert s["prev"][0, 0] == 0 and s["next"][0, 0] == 0 and s["max"][0, 0] == 1
    assert s["offset"][0, 0] == 0 and s["offset_share"][0, 0] == 1
    assert s["first"][0, 0] == 0  # rows i >= 1 only: row 0's self-weight is not sink mass
    assert s.labels == [["self"]]


def test_shifted_identity_is_previous_token():
    w = np.eye(5, k=-1)
    w[0, 0] = 1  # row 0 has no previous token: it looks at itself
    s = head_stats(att(w, TOKS, mask=np.tril(np.ones((5, 5)))))
    assert s["prev"][0, 0] == 1  # rows 1..4, row 0 left out
    assert s["self"][0, 0] == pytest.approx(1 / 5)
    assert s["next"][0, 0] == 0  # causal: masked keys count 0
    assert s["offset"][0, 0] == -1 and s["offset_share"][0, 0] == pytest.approx(4 / 5)
    assert s["first"][0, 0] == pytest.approx(1 / 4)  # only row 1 puts its mass on token 0
    assert s.labels == [["previous-token"]]


def test_next_token_and_offsets():
    w = np.eye(5, k=1)
    w[4, 4] = 1
    s = head_stats(att(w, TOKS))
    assert s["next"][0, 0] == 1 and s["offset"][0, 0] == 1
    assert s.labels == [["next-token"]]


def test_uniform_over_allowed_keys_has_entropy_norm_one():
    causal = np.tril(np.ones((5, 5), bool))
    s = head_stats(att(uniform(causal), TOKS, mask=causal))
    assert s["entropy_norm"][0, 0] == pytest.approx(1)  # row 0 (one key) left out
    # entropy: mean over all 5 rows of ln(n_i), n_i = 1..5
    assert s["entropy"][0, 0] == pytest.approx(np.mean(np.log(np.arange(1, 6))))
    assert s["max"][0, 0] == pytest.approx(np.mean(1 / np.arange(1, 6)))
    assert s.labels == [["broad"]]


def test_first_special_and_punct_mass():
    toks = ["[CLS]", "hi", ",", "you", "[SEP]"]
    w = np.zeros((5, 5))
    w[:, 0] = 0.5
    w[:, 2] = 0.3
    w[:, 4] = 0.2
    s = head_stats(att(w, toks))
    assert s["first"][0, 0] == pytest.approx(0.5)
    assert s["special"][0, 0] == pytest.approx(0.7)
    assert s["punct"][0, 0] == pytest.approx(0.3)
    assert s.labels == [["sink / [CLS]"]]
    # `special=` names the special tokens; then [CLS] is just a word
    assert head_stats(att(w, toks), special={"[SEP]"})["special"][0, 0] == pytest.approx(0.2)
    w2 = np.zeros((5, 5))
    w2[:, 4] = 1
    assert head_stats(att(w2, toks)).labels == [["[SEP]"]]


def test_induction_pattern_on_a_repeated_sequence():
    n = 8
    toks = [f"t{k}" for k in range(n)] * 2
    L = 2 * n
    w = np.zeros((L, L))
    w[:n, 0] = 1  # the first copy rests on token 0
    for i in range(n, L):
        w[i, i - n + 1] = 1  # after the earlier copy of me: the token that followed it
    mask = np.tril(np.ones((L, L), bool))
    s = head_stats(att(w, toks, mask=mask))
    assert s["induction"][0, 0] == 1 and s["duplicate"][0, 0] == 0
    # a duplicate-token head: the earlier copy of me
    d = np.zeros((L, L))
    d[:n, 0] = 1
    for i in range(n, L):
        d[i, i - n] = 1
    s = head_stats(att(d, toks, mask=mask))
    assert s["duplicate"][0, 0] == 1 and s["induction"][0, 0] == 0
    # half the mass on the induction key: Σ(A⊙P)/ΣA = 1/2 over the rows that have one
    h = (w + d) / 2
    assert head_stats(att(h, toks, mask=mask))["induction"][0, 0] == pytest.approx(0.5)


def test_induction_label_needs_enough_rows():
    toks = ["the", "cat", "the", "dog"]
    w = np.zeros((4, 4))
    w[:, 0] = 1
    w[2] = [0, 1, 0, 0]  # "the" -> what followed the earlier "the": a perfect score on one row
    s = head_stats(att(w, toks))
    assert s["induction"][0, 0] == 1 and s.labels[0][0] != "induction"


def test_undefined_statistics_are_nan_and_null_in_json():
    s = head_stats(att(np.eye(3), ["x", "y", "z"]))
    assert math.isnan(s["duplicate"][0, 0]) and math.isnan(s["induction"][0, 0])
    js = s.to_json()
    assert js["stats"]["duplicate"] == [[None]] and list(js["stats"]) == list(STATS)
    assert js["layers"] == 1 and js["heads"] == 1 and js["labels"] == [["self"]]


def test_rows_without_allowed_keys_are_left_out():
    mask = np.ones((3, 3), bool)
    mask[1] = False
    w = np.eye(3)
    w[1] = 0
    s = head_stats(att(w, ["x", "y", "z"], mask=mask))
    assert s["self"][0, 0] == 1 and s["max"][0, 0] == 1


def test_per_layer_masks_are_used():
    L = 4
    w = np.stack([uniform(np.tril(np.ones((L, L)))), uniform(np.ones((L, L)))])[:, None]
    masks = np.stack([np.tril(np.ones((L, L), bool)), np.ones((L, L), bool)])
    a = ModelAttention(tokens=list("abcd"), weights=w, mask=masks.any(0), scale=1.0,
                       model_name="toy", causal=False, layer_masks=masks)
    np.testing.assert_allclose(head_stats(a)["entropy_norm"][:, 0], [1, 1])


def test_several_texts_are_the_mean_of_single_texts():
    rng = np.random.default_rng(0)
    texts = []
    for L, toks in ((5, "abcab"), (7, "xyzxyzq")):
        w = rng.random((2, 3, L, L))
        texts.append(att(w / w.sum(-1, keepdims=True), list(toks)))
    both = head_stats(texts)
    one, two = head_stats(texts[0]), head_stats(texts[1])
    for name in STATS:
        if name in ("offset", "offset_share"):
            continue
        np.testing.assert_allclose(both[name], (one[name] + two[name]) / 2, err_msg=name)
    assert both.texts == 2


def test_offset_over_texts_is_the_largest_mean_share():
    prev = np.eye(4, k=-1)
    prev[0, 0] = 1
    shares = head_stats([att(prev, "abcd"), att(np.eye(4), "abcd")])
    # text 1: -1 on 3/4 rows, 0 on 1/4; text 2: 0 on all: mean shares -1: 3/8, 0: 5/8
    assert shares["offset"][0, 0] == 0 and shares["offset_share"][0, 0] == pytest.approx(5 / 8)


def test_text_stats_checks_its_arguments():
    with pytest.raises(AttnlabError, match=r"weights: expected \(layers, H, L, S\)"):
        text_stats(np.eye(3), np.ones((3, 3)), "abc", [False] * 3)
    with pytest.raises(AttnlabError, match="mask: expected"):
        text_stats(np.eye(3)[None, None], np.ones((2, 3)), "abc", [False] * 3)
    with pytest.raises(AttnlabError, match="captures"):
        head_stats([])
    with pytest.raises(AttnlabError, match=r"captures\[1\]"):
        head_stats([att(np.eye(3), "abc"), att(np.ones((2, 1, 3, 3)) / 3, "abc")])


def test_token_kinds():
    assert looks_special("[CLS]") and looks_special("</s>") and looks_special("<|endoftext|>")
    assert not looks_special("cat") and not looks_special("[")
    assert is_punct(".") and is_punct("##,") and is_punct("\u0120?!") and not is_punct("a.")
    assert not is_punct("")


def test_ranked_orders_heads_largest_first_nan_last_ties_in_order():
    from attnlab.explain.head_statistics import HeadStats

    grid = {name: np.zeros((2, 2)) for name in STATS}
    grid["max"] = np.array([[0.5, np.nan], [0.9, 0.5]])
    stats = HeadStats(model="m", texts=1, stats=grid, labels=[["-", "-"], ["-", "-"]])
    assert stats.ranked("max") == [(1, 0), (0, 0), (1, 1), (0, 1)]
    with pytest.raises(AttnlabError, match="statistic 'nope'"):
        stats.ranked("nope")
