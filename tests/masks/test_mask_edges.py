"""A dense mask's tiles over several row and column blocks with ragged edges, and the messages
and reprs of the sequence masks."""

from __future__ import annotations

import pytest
import torch

from attnlab import AttnlabError, masks
from attnlab.masks import EMPTY, FULL, PARTIAL


def classes(dense: torch.Tensor, bq: int, bk: int) -> torch.Tensor:
    """Tile classes from the dense matrix, cell by cell (ragged edge tiles hold fewer cells)."""
    L, S = dense.shape[-2:]
    out = torch.empty(*dense.shape[:-2], -(-L // bq), -(-S // bk), dtype=torch.int8)
    for a in range(out.shape[-2]):
        for b in range(out.shape[-1]):
            cell = dense[..., a * bq:(a + 1) * bq, b * bk:(b + 1) * bk].flatten(-2)
            out[..., a, b] = torch.where(cell.all(-1), FULL, torch.where(cell.any(-1), PARTIAL,
                                                                          EMPTY))
    return out


@pytest.mark.parametrize("bq,bk", [(4, 5), (5, 4), (17, 13), (1, 3)])
def test_from_dense_tiles_are_exact_with_ragged_edges(bq, bk):
    g = torch.Generator().manual_seed(2)
    d = torch.rand(2, 3, 17, 13, generator=g) > 0.5
    d[0, 0] = True  # every tile full, the ragged edge ones too
    d[0, 1] = False
    d[1, 2, :8, :10] = True
    for m in (masks.from_dense(d), masks.from_dense(d[1, 2])):
        got = m.tiles(17, 13, bq, bk)
        assert torch.equal(got, classes(m.to_dense(17, 13), bq, bk).expand(got.shape))
    assert bool((masks.from_dense(d).tiles(17, 13, bq, bk)[0, 0] == FULL).all())


def test_messages_name_the_argument_and_the_shapes():
    with pytest.raises(AttnlabError, match=r"from_dense: mask is \(4, 5\) but the scores are "
                                           r"\(L, S\) = \(4, 6\)"):
        masks.from_dense(torch.ones(4, 5, dtype=torch.bool)).check(4, 6)
    with pytest.raises(AttnlabError, match=r"segment_ids: expected shape \(L,\) or \(B, L\), "
                                           r"got \(1, 2, 3\)"):
        masks.document(torch.zeros(1, 2, 3, dtype=torch.long))
    with pytest.raises(AttnlabError, match="kv_segment_ids: batch 3 does not match "
                                           "segment_ids batch 2"):
        masks.document(torch.zeros(2, 4, dtype=torch.long), torch.zeros(3, 4, dtype=torch.long))


def test_padding_repr_shows_both_lengths():
    assert repr(masks.padding(key_lengths=[3, 5], query_lengths=[2, 4])) == \
        "padding(key_lengths=[3, 5], query_lengths=[2, 4])"
    assert repr(masks.padding(query_lengths=[2])) == "padding(key_lengths=None, query_lengths=[2])"
