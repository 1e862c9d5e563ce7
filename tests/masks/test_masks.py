"""Structured masks: each against its definition written as a double loop, tile classes against
the dense matrix (EMPTY and FULL exact for every mask), combinators, and bad arguments."""

from __future__ import annotations

import pytest
import torch

from attnlab import AttnlabError, masks
from attnlab.masks import EMPTY, FULL

from helpers import tiles_from_dense


def brute(fn, B, L, S):
    """bool (B, 1, L, S) from a predicate fn(b, i, j), the slow obvious way."""
    return torch.tensor([[[[bool(fn(b, i, j)) for j in range(S)] for i in range(L)]]
                         for b in range(B)])


SEG = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 4, 4, 4],
                    [0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3]])

CASES = {
    "causal_tl": (lambda: masks.causal(), lambda b, i, j, L, S: j <= i),
    "causal_br": (lambda: masks.causal("bottom_right"), lambda b, i, j, L, S: j <= i + S - L),
    "sliding_5": (lambda: masks.sliding_window(5), lambda b, i, j, L, S: i - 5 < j <= i),
    "sliding_br": (lambda: masks.sliding_window(3, "bottom_right"),
                   lambda b, i, j, L, S: i + S - L - 3 < j <= i + S - L),
    "padding": (lambda: masks.padding(key_lengths=[17, 6], query_lengths=[9, 17]),
                lambda b, i, j, L, S: j < [17, 6][b] and i < [9, 17][b]),
    "padding_keys": (lambda: masks.padding(key_lengths=[4, 11]),
                     lambda b, i, j, L, S: j < [4, 11][b]),
    "prefix_lm": (lambda: masks.prefix_lm([4, 7]),
                  lambda b, i, j, L, S: j <= i or j < [4, 7][b]),
    "document": (lambda: masks.document(SEG),
                 lambda b, i, j, L, S: SEG[b, i] == SEG[b, j]),
    "causal_document": (lambda: masks.causal() & masks.document(SEG),
                        lambda b, i, j, L, S: j <= i and SEG[b, i] == SEG[b, j]),
    "not_sliding": (lambda: ~masks.sliding_window(2), lambda b, i, j, L, S: not i - 2 < j <= i),
    "or": (lambda: masks.sliding_window(2) | masks.padding(key_lengths=[3, 1]),
           lambda b, i, j, L, S: i - 2 < j <= i or j < [3, 1][b]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_dense_matches_definition(name):
    make, fn = CASES[name]
    L = S = 17
    m = make()
    want = brute(lambda b, i, j: fn(b, i, j, L, S), 2, L, S)
    got = m.to_dense(L, S).expand(2, 1, L, S)
    assert torch.equal(got, want), f"{m!r}: {int((got != want).sum())} cells differ"


@pytest.mark.parametrize("name", ["causal_tl", "causal_br", "sliding_5", "sliding_br"])
@pytest.mark.parametrize("L,S", [(5, 13), (13, 5), (1, 1)])
def test_rectangular(name, L, S):
    make, fn = CASES[name]
    want = brute(lambda b, i, j: fn(b, i, j, L, S), 1, L, S)
    assert torch.equal(make().to_dense(L, S), want)


EXACT = {"causal_tl", "causal_br", "sliding_5", "sliding_br", "padding", "padding_keys",
         "not_sliding"}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("bq,bk", [(4, 4), (3, 5), (16, 16), (1, 1), (32, 2)])
def test_tiles_agree_with_dense(name, bq, bk):
    make, _ = CASES[name]
    m, L, S = make(), 17, 17
    want = tiles_from_dense(m.to_dense(L, S), bq, bk)
    got = m.tiles(L, S, bq, bk)
    assert got.shape == want.shape
    # EMPTY and FULL must always be right (a kernel skips or doesn't mask them) ...
    assert ((got == EMPTY) <= (want == EMPTY)).all(), "tile called EMPTY has allowed cells"
    assert ((got == FULL) <= (want == FULL)).all(), "tile called FULL has masked cells"
    # ... and the primitive masks classify exactly
    if name in EXACT or (bq, bk) == (1, 1):
        assert torch.equal(got, want)


def test_tiles_skip_most_work_for_sliding_window():
    t = masks.sliding_window(256).tiles(16384, 16384, 128, 128)
    non_empty = (t != EMPTY).float().mean().item()
    assert non_empty < 0.03  # 3 of 128 key blocks per query block


def test_from_dense_roundtrip_and_per_head():
    d = torch.rand(2, 3, 6, 7) > 0.5
    m = masks.from_dense(d)
    assert (m.batch_size, m.heads) == (2, 3)
    assert torch.equal(m.to_dense(6, 7), d)
    assert torch.equal((~m).to_dense(6, 7), ~d)
    rows, cols = torch.tensor([5, 1]), torch.tensor([0, 6, 2])
    assert torch.equal(m.block(rows, cols, 6, 7), d[:, :, rows][:, :, :, cols])


def test_repr_names_the_mask():
    assert "sliding_window(4" in repr(masks.causal() & masks.sliding_window(4))


@pytest.mark.parametrize("make,match", [
    (lambda: masks.causal(align="middle"), "align"),
    (lambda: masks.sliding_window(0), "size"),
    (lambda: masks.sliding_window(2.5), "size"),
    (lambda: masks.padding(), "key_lengths"),
    (lambda: masks.padding(key_lengths=[3, -1]), "key_lengths"),
    (lambda: masks.padding(key_lengths=[3.0]), "key_lengths"),
    (lambda: masks.padding(key_lengths=[1, 2], query_lengths=[1, 2, 3]), "query_lengths"),
    (lambda: masks.document([[0.5, 1.0]]), "segment_ids"),
    (lambda: masks.from_dense(torch.zeros(3, 3)), "bool"),
    (lambda: masks.from_dense(torch.zeros(3, dtype=torch.bool)), "from_dense"),
    (lambda: masks.causal() & torch.ones(2, 2, dtype=torch.bool), "combine"),
    (lambda: masks.padding(key_lengths=[1, 2]) & masks.padding(key_lengths=[1, 2, 3]),
     "batch"),
])
def test_bad_arguments(make, match):
    with pytest.raises(AttnlabError, match=match):
        make()


def test_document_length_checked_against_scores():
    with pytest.raises(AttnlabError, match=r"segment_ids: .*L = 5"):
        masks.document([0, 0, 1]).check(5, 5)
