"""A causal mask's diagonal blocks (a run of consecutive positions against the same positions)
are computed as SDPA's top-left causal pattern, unchunked and without a dense mask; every other
block keeps its dense mask. What a CAUSAL block stands for equals the mask on its positions."""

import pytest
import torch

from attnlab import masks
from attnlab.distributed.attend import CAUSAL, Call
from attnlab.distributed.geometry import Geometry
from attnlab.masks import PARTIAL


def _call(L, world, layout, mask, rank, dropout_p=0.0):
    g = Geometry(L, L, world, layout, mask)
    return Call(g, None, rank, world, 0.125, None, torch.float32, dropout_p=dropout_p)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_diagonal_blocks_of_a_causal_mask_are_causal_blocks(layout, world):
    L = 4096  # diagonal blocks are larger than one chunk of rows under the score budget
    q = torch.zeros(2, 8, 1, 4)
    for rank in range(world):
        c = _call(L, world, layout, masks.causal(), rank)
        pieces = c.geom.k.pieces(rank)
        seen = 0
        for qi, rows, kp, allowed in c.pairs(pieces, q):
            qp = c.q_pieces[qi]
            if qp.chunk == kp.chunk:  # the diagonal: whole, causal, no dense mask
                assert allowed is CAUSAL and rows == slice(qp.start, qp.start + qp.length)
                dense = masks.causal().block(qp.positions, kp.positions, L, L)[0, 0]
                assert torch.equal(dense, torch.ones(qp.length, kp.length, dtype=bool).tril())
                seen += 1
            else:
                assert allowed is None or allowed is not CAUSAL
        assert seen == len(c.q_pieces)


@pytest.mark.parametrize("mask", [masks.sliding_window(64), masks.causal("bottom_right")
                                  & masks.padding(key_lengths=[900]), None])
def test_other_masks_striped_layouts_and_dropout_keep_dense_blocks(mask):
    q = torch.zeros(1, 2, 1, 4)
    cases = [_call(1024, 2, "zigzag", mask, 0), _call(1024, 2, "striped", masks.causal(), 0),
             _call(1024, 2, "zigzag", masks.causal(), 0, dropout_p=0.1)]
    for c in cases:
        classes = [c.geom.pair_class(qp, kp) for qp in c.q_pieces for kp in c.geom.k.pieces(0)]
        assert all(a is not CAUSAL for *_, a in c.pairs(c.geom.k.pieces(0), q))
        assert c.geom.mask is None or PARTIAL in classes
