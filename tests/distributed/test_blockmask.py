"""A global mask seen from a block that starts past position 0 (`BlockOf`): its tile classes
equal those of the dense mask's block, for band masks (whose own tile arithmetic reads the whole
problem's rows), function and dense masks (whose tiles assume the whole grid) and the rest."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab import masks
from attnlab.distributed.blockmask import BlockOf
from attnlab.masks.base import classify

L = 24
MASKS = {
    "window": lambda: masks.window(3, 0),
    "block_causal": lambda: masks.block_causal([8, 8, 8]),
    "block_diagonal": lambda: masks.block_diagonal([12, 12], left=2, right=1),
    "ragged_causal": lambda: masks.ragged_causal(query_lengths=[24, 21], key_lengths=[24, 19]),
    "window_and_blocks": lambda: masks.sliding_window(5) & masks.block_causal([10, 14]),
    "function": lambda: masks.from_function(lambda b, h, q, k: (q - k >= 0) & (q - k < 5)),
    "function_per_head": lambda: masks.from_function(
        lambda b, h, q, k: (q >= k) & (q - k < h + 2), heads=3),
    "dense": lambda: masks.from_dense(torch.rand(2, 1, L, L, generator=torch.Generator()
                                                 .manual_seed(0)) > 0.5),
    "not_window": lambda: ~masks.window(3, 1),
}


def dense_classes(d: torch.Tensor, bq: int, bk: int) -> torch.Tensor:
    Lb, Sb = d.shape[-2:]
    nq, nk = -(-Lb // bq), -(-Sb // bk)
    pad = (0, nk * bk - Sb, 0, nq * bq - Lb)
    shape = (*d.shape[:2], nq, bq, nk, bk)
    any_ = F.pad(d, pad, value=False).reshape(shape).any(-1).any(-2)
    all_ = F.pad(d, pad, value=True).reshape(shape).all(-1).all(-2)
    return classify(all_, ~any_)


@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("q0, k0, Lb, Sb", [(12, 6, 12, 12), (0, 0, 12, 12), (5, 3, 7, 9)])
def test_block_tiles_are_the_dense_blocks_classes(kind, q0, k0, Lb, Sb):
    m = MASKS[kind]()
    block = BlockOf(m, q0, k0, L, L)
    d = m.to_dense(L, L)[..., q0:q0 + Lb, k0:k0 + Sb]
    for bq, bk in ((4, 4), (3, 5), (16, 16)):
        got = block.tiles(Lb, Sb, bq, bk)
        want = dense_classes(d, bq, bk)
        assert torch.equal(got, want.expand_as(got)), (kind, bq, bk, got, want)
