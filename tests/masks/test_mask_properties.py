"""What a mask says about itself (shift_invariant, is_top_left_causal, simplified), checked against
its dense matrix: kernels trust these instead of asking for concrete mask classes."""

from __future__ import annotations

import pytest
import torch

from attnlab import masks
from attnlab.masks.sequence import KeyPrefix

SEG = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])

MASKS = {
    "causal": (lambda: masks.causal(), True, True),
    "causal_br": (lambda: masks.causal("bottom_right"), True, False),
    "sliding": (lambda: masks.sliding_window(3), True, False),
    "not_sliding": (lambda: ~masks.sliding_window(2), True, False),
    "causal_and_sliding": (lambda: masks.causal() & masks.sliding_window(4), True, False),
    "sliding_or_causal_br": (lambda: masks.sliding_window(2) | masks.causal("bottom_right"),
                             True, False),
    "padding": (lambda: masks.padding(key_lengths=[5]), False, False),
    "document": (lambda: masks.document(SEG), False, False),
    "prefix_lm": (lambda: masks.prefix_lm(3), False, False),
    "causal_and_document": (lambda: masks.causal() & masks.document(SEG), False, False),
    "dense_causal": (lambda: masks.from_dense(torch.ones(8, 8, dtype=torch.bool).tril()),
                     False, False),
}


@pytest.mark.parametrize("name", MASKS)
def test_flags(name):
    make, shift, top_left = MASKS[name]
    m = make()
    assert m.shift_invariant is shift
    assert m.is_top_left_causal is top_left


@pytest.mark.parametrize("name", [n for n, (_, shift, _) in MASKS.items() if shift])
@pytest.mark.parametrize("L, S", [(8, 8), (5, 8), (8, 5)])
def test_shift_invariant_means_one_mask_per_diagonal(name, L, S):
    dense = MASKS[name][0]().to_dense(L, S)[0, 0]  # (L, S)
    for off in range(-L + 1, S):
        diag = torch.diagonal(dense, offset=off)
        assert diag.all() or not diag.any(), (off, diag)


@pytest.mark.parametrize("L, S", [(1, 1), (4, 4), (3, 7), (7, 3)])
def test_top_left_causal_is_sdpa_is_causal(L, S):
    assert torch.equal(masks.causal().to_dense(L, S)[0, 0],
                       torch.ones(L, S, dtype=torch.bool).tril())


@pytest.mark.parametrize("name", MASKS)
@pytest.mark.parametrize("L, S", [(8, 8), (1, 8), (5, 8)])
def test_simplified_is_the_same_mask(name, L, S):
    m = MASKS[name][0]()
    if name in ("document", "causal_and_document", "dense_causal") and L != 8:
        return  # these masks hold one id per position: only L = S = 8
    simple = m.simplified(L, S)
    want = m.to_dense(L, S)
    got = torch.ones_like(want) if simple is None else simple.to_dense(L, S).expand_as(want)
    assert torch.equal(got, want)


def test_bottom_right_causal_simplifies():
    m = masks.causal("bottom_right")
    assert m.simplified(6, 6).is_top_left_causal  # prefill: SDPA's is_causal=True
    assert m.simplified(1, 6) is None  # one decoding step sees every key
    assert m.simplified(3, 6) is m
    assert masks.causal().simplified(1, 6) is not None  # top-left: query 0 sees key 0 only


def test_key_prefix_lives_with_the_sequence_masks():
    m = masks.prefix_lm([2, 4])
    assert isinstance(m.b, KeyPrefix) and m.batch_size == 2
