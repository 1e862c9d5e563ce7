"""Mask evaluation allocates no int64 L×S index tensor: comparisons of two broadcast aranges give
bool blocks directly (an int64 distance matrix at L = S = 65536 would be 32 GiB)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab import masks

L, S = 96, 80


class BigTensors(TorchDispatchMode):
    """Records (op, dtype) of every op result with at least L·S elements."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() >= L * S:
                self.seen.append((str(func), t.dtype))
        return out


MASKS = {
    "causal": lambda: masks.causal(),
    "causal_br": lambda: masks.causal("bottom_right"),
    "window": lambda: masks.sliding_window(7),
    "window_br": lambda: masks.sliding_window(7, "bottom_right"),
    "window_huge": lambda: masks.sliding_window(2**62),
    "prefix_lm": lambda: masks.prefix_lm([3, 40]),
    "padding": lambda: masks.padding(key_lengths=[5, 80], query_lengths=[96, 7]),
    "document": lambda: masks.document(torch.arange(L) // 9, torch.arange(S) // 8),
    "combined": lambda: ~masks.sliding_window(7) & masks.causal() | masks.padding([3]),
}


@pytest.mark.parametrize("name", list(MASKS))
def test_dense_evaluation_allocates_only_bool_blocks(name):
    mask = MASKS[name]()
    with BigTensors() as rec:
        dense = mask.to_dense(L, S)
    assert dense.dtype == torch.bool
    wide = [(op, dt) for op, dt in rec.seen if dt != torch.bool]
    assert not wide, f"{name}: L×S-sized non-bool intermediates {wide}"


def test_the_recorder_sees_an_int64_distance_matrix():
    """The check above can fail: an (L, S) int64 distance matrix is recorded."""
    with BigTensors() as rec:
        d = torch.arange(L)[:, None] - torch.arange(S)[None, :]
        _ = (d >= 0) & (d < 7)
    assert (("aten.sub.Tensor", torch.int64) in rec.seen)


def test_huge_window_equals_causal():
    for align in ("top_left", "bottom_right"):
        for l, s in ((5, 9), (9, 5), (7, 7)):
            assert torch.equal(masks.sliding_window(2**63 - 1, align).to_dense(l, s),
                               masks.causal(align).to_dense(l, s))
            t = masks.sliding_window(2**63 - 1, align).tiles(l, s, 2, 3)
            assert torch.equal(t, masks.causal(align).tiles(l, s, 2, 3))
