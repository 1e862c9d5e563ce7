"""Band masks (window, ragged_causal, block_diagonal) as mask kinds: exact tile classes, per-row
intervals, and `&`/`~` with the other kinds, all against the dense matrix."""

from __future__ import annotations

import pytest
import torch

from attnlab import AttnlabError, masks
from attnlab.masks import EMPTY, FULL

from helpers import tiles_from_dense

KINDS = {
    "window_tl": lambda: masks.window(3, 2),
    "window_br": lambda: masks.window(1, 4, "bottom_right"),
    "window_left_only": lambda: masks.window(None, 2, "bottom_right"),
    "ragged_causal": lambda: masks.ragged_causal([17, 9, 4], [23, 20, 3]),
    "ragged_window": lambda: masks.window(2, 1, "bottom_right", query_lengths=[5, 17],
                                          key_lengths=[23, 8]),
    "block_causal_br": lambda: masks.block_causal([5, 1, 7, 4], [3, 9, 8, 3], "bottom_right"),
    "block_local": lambda: masks.block_diagonal([6, 6, 5], [8, 2, 10], left=2, right=1),
}
L, S = 17, 23


@pytest.mark.parametrize("name", list(KINDS))
@pytest.mark.parametrize("bq,bk", [(1, 1), (4, 4), (3, 5), (16, 8), (32, 64)])
def test_tiles_are_exact(name, bq, bk):
    m = KINDS[name]()
    assert torch.equal(m.tiles(L, S, bq, bk), tiles_from_dense(m.to_dense(L, S), bq, bk))


@pytest.mark.parametrize("name", list(KINDS))
def test_intervals_are_the_dense_rows(name):
    m = KINDS[name]()
    lo, hi = m.intervals(L, S)
    assert lo.dtype == torch.int32 and lo.shape == (m.batch_size, m.heads, L)
    j = torch.arange(S)
    from_intervals = (j >= lo[..., None].long()) & (j < hi[..., None].long())
    assert torch.equal(from_intervals, m.to_dense(L, S))


@pytest.mark.parametrize("name", list(KINDS))
def test_blocks_agree_with_dense(name):
    m = KINDS[name]()
    rows, cols = torch.tensor([16, 0, 5, 9]), torch.tensor([22, 3, 0, 11, 7])
    assert torch.equal(m.block(rows, cols, L, S), m.to_dense(L, S)[:, :, rows][:, :, :, cols])


@pytest.mark.parametrize("name", list(KINDS))
def test_combinations_stay_safe(name):
    m = KINDS[name]()
    for c in (m & masks.padding(key_lengths=[20]), ~m, m | masks.causal()):
        t, want = c.tiles(L, S, 4, 4), tiles_from_dense(c.to_dense(L, S), 4, 4)
        assert ((t == EMPTY) <= (want == EMPTY)).all() and ((t == FULL) <= (want == FULL)).all()


def test_shift_invariant_only_without_lengths():
    assert masks.window(2, 2).shift_invariant
    assert not masks.ragged_causal([3], [4]).shift_invariant


@pytest.mark.parametrize("make,match", [
    (lambda: masks.window(1.5, 0), "left"),
    (lambda: masks.window(1, True), "right"),
    (lambda: masks.window(1, 0, "middle"), "align"),
    (lambda: masks.window(1, 0, query_lengths=[3]), "align"),
    (lambda: masks.ragged_causal(), "ragged_causal"),
    (lambda: masks.ragged_causal([1, 2], [1, 2, 3]), "key_lengths"),
    (lambda: masks.block_causal([2, 2], window=0), "window"),
    (lambda: masks.block_diagonal([]), "query_lengths"),
])
def test_bad_arguments(make, match):
    with pytest.raises(AttnlabError, match=match):
        make()


def test_lengths_beyond_the_call_are_refused():
    with pytest.raises(AttnlabError, match="key_lengths"):
        masks.ragged_causal([2], [30]).to_dense(4, 8)


def test_tiles_stay_on_the_device_without_host_sync():
    """The classes come from searchsorted / scatter on the tensors' device: on `meta` nothing can
    be read back, so any host sync would raise."""
    m = masks.window(8, 0, "bottom_right", query_lengths=[100, 60], key_lengths=[128, 90])
    t = m.tiles(100, 128, 16, 16, device="meta")
    assert t.shape == (2, 1, 7, 8) and t.device.type == "meta"
    lo, _ = masks.block_causal([40, 60], [64, 64]).intervals(100, 128, device="meta")
    assert lo.device.type == "meta"
