"""A BlockMask as an attnlab Mask: exact tile classes at any kernel's block sizes, the mask pair
by pair, row intervals from the partial blocks only; and the broadcast / vmap adapter deciding
once per shape."""

from __future__ import annotations

import pytest
import torch

from attnlab.flex import create_block_mask
from attnlab.flex.block import BlockMaskMask, classes_of
from attnlab.flexfn import Adapted
from attnlab.masks import EMPTY, FULL, PARTIAL
from flex_gallery import CASES, flamingo

from helpers import tiles_from_dense


def made(name, L=None, S=None, block=128):
    case = CASES[name]
    L, S = L or case.L, S or case.S
    bm = create_block_mask(case.mask_mod, None, None, L, S, device="cpu", BLOCK_SIZE=block)
    return bm, BlockMaskMask(bm, Adapted(case.mask_mod, score=False)), case.mask_mod


def dense_of(fn, L, S):
    i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
    return torch.vmap(torch.vmap(lambda a, b: fn(0, 0, a, b), (None, 0)), (0, None))(
        i[:, 0], j[0])[None, None]  # (1, 1, L, S)


@pytest.mark.parametrize("name", ["gym sliding_window", "gym document causal", "gym natten",
                                  "gym svg temporal"])
@pytest.mark.parametrize("bq, bk", [(128, 64), (64, 128), (96, 40), (256, 256), (8, 7)])
def test_tile_classes_at_any_block_size_are_exact(name, bq, bk):
    _, m, fn = made(name, block=32)
    L, S = m.L, m.S
    exact = tiles_from_dense(dense_of(fn, L, S), bq, bk)
    got = m.tiles(L, S, bq, bk)
    assert got.shape == exact.shape
    assert torch.equal(got, exact)


@pytest.mark.parametrize("name", sorted(n for n in CASES if CASES[n].mask_mod is not None
                                        and not CASES[n].mask_bh))
def test_the_mask_and_its_intervals_match_the_dense_mask(name):
    _, m, fn = made(name, block=32)
    dense = dense_of(fn, m.L, m.S)
    assert torch.equal(m.to_dense(m.L, m.S), dense)
    iv = m.intervals(m.L, m.S)
    j = torch.arange(m.S)
    runs = (dense[..., 1:].int() - dense[..., :-1].int()).clamp(min=0).sum(-1) + dense[..., 0]
    if bool((runs <= 1).all()):
        assert iv is not None, f"{name}: every row is one interval"
        lo, hi = iv
        assert torch.equal((j >= lo[..., None]) & (j < hi[..., None]), dense)
    else:
        assert iv is None


def test_classes_come_from_the_block_lists():
    bm, _, fn = made("gym prefix_lm", L=512, S=512)
    exact = tiles_from_dense(dense_of(fn, 512, 512), 128, 128)
    assert torch.equal(classes_of(bm), exact)
    assert set(classes_of(bm).unique().tolist()) == {EMPTY, PARTIAL, FULL}


def test_the_adapter_decides_once_per_shape_and_keeps_the_form():
    spans = torch.tensor([[0, 5], [3, 9]])
    fn = flamingo(spans, 4)
    calls = []

    def counted(b, h, q, kv):
        calls.append(1)
        return fn(b, h, q, kv)

    a = Adapted(counted, score=False)
    idx = (torch.zeros(1, 1, 1, 1, dtype=torch.int64), torch.zeros(1, 1, 1, 1, dtype=torch.int64),
           torch.arange(9)[None, None, :, None], torch.arange(8)[None, None, None, :])
    first = a(*idx)
    assert a.form == "vmap" and first.shape == (1, 1, 9, 8)
    n = len(calls)
    assert torch.equal(a(*idx), first) and len(calls) == n + 1  # no second decision
    want = torch.tensor([[spans[kv // 4][0] <= q < spans[kv // 4][1] for kv in range(8)]
                         for q in range(9)])
    assert torch.equal(first[0, 0], want)
