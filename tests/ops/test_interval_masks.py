"""Mask.intervals: per-row key intervals equal to the mask's dense matrix for every interval-shaped
mask and their `&` / `|`, None where a row's keys are not one interval, in O(L)."""

from __future__ import annotations

import pytest
import torch

from attnlab import masks

SIZES = [(1, 1), (7, 7), (5, 12), (12, 5), (33, 33)]


def cases(L, S):
    seg = torch.tensor([0] * (L // 3) + [1] * (L - L // 3 - L // 5) + [2] * (L // 5))
    out = {
        "causal": masks.causal(),
        "causal_br": masks.causal("bottom_right"),
        "window": masks.sliding_window(3),
        "window_br": masks.sliding_window(4, "bottom_right"),
        "prefix": masks.prefix_lm([2, 0]),
        "padding": masks.padding(key_lengths=[S, max(S - 2, 0)], query_lengths=[L, L // 2]),
        "keys_only": masks.padding(key_lengths=[1, S]),
        "window&padding": masks.sliding_window(2) & masks.padding(key_lengths=[S - 1, S]),
        "prefix_br": masks.prefix_lm(3, "bottom_right"),
        "window|causal": masks.sliding_window(2) | masks.causal(),
    }
    if L == S:
        out["document"] = masks.document(seg)
        out["document&causal"] = masks.document(torch.stack([seg, seg.flip(0)])) & masks.causal()
    return out


@pytest.mark.parametrize("L,S", SIZES)
def test_intervals_equal_the_dense_mask(L, S):
    for name, m in cases(L, S).items():
        got = m.intervals(L, S)
        assert got is not None, name
        lo, hi = got
        assert lo.dtype == hi.dtype == torch.int32 and lo.dim() == 3 and lo.shape[-1] == L
        j = torch.arange(S)
        from_iv = (j >= lo[..., None]) & (j < hi[..., None])  # (Bm, Hm, L, S)
        dense = m.to_dense(L, S)
        assert torch.equal(*torch.broadcast_tensors(from_iv, dense)), name
        assert bool(((lo < hi) | ((lo == 0) & (hi == 0))).all()), f"{name}: empty rows 0, 0"


def test_not_intervals_say_none():
    L = S = 9
    assert masks.from_dense(torch.ones(L, S, dtype=torch.bool)).intervals(L, S) is None
    assert (~masks.causal()).intervals(L, S) is None
    assert masks.document([0, 0, 1, 1, 0, 0, 2, 2, 2]).intervals(L, S) is None  # id 0 split
    disjoint = masks.sliding_window(1) | masks.prefix_lm(2) & ~masks.causal()
    assert disjoint.intervals(L, S) is None
    gap = masks.padding(key_lengths=2) | masks.sliding_window(1)  # row 5: {0, 1} and {5}
    assert gap.intervals(L, S) is None


def test_intervals_are_linear_in_L():
    """A million rows: an L×S matrix would be 10^12 entries; the intervals take O(L)."""
    n = 1 << 20
    lo, hi = (masks.sliding_window(256) & masks.causal()).intervals(n, n)
    assert lo.shape == (1, 1, n) and int(hi[0, 0, -1]) == n and int(lo[0, 0, -1]) == n - 256
