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


# -- masks copy the tensors they are given (issue 35 item 3) -------------------------------------


@pytest.mark.parametrize("kind", ["padding", "document", "from_dense", "window", "block_causal",
                                  "prefix_lm"])
def test_a_mask_keeps_its_values_when_the_callers_tensor_changes(kind):
    """A reused batch buffer written after the mask was built changes nothing: auto, tiled and
    math all use the values the mask was built from (no stale cache against fresh reads)."""
    import attnlab

    L = 40
    t = {"padding": torch.tensor([40, 23]), "document": torch.arange(L) // 9,
         "from_dense": torch.rand(L, L, generator=torch.Generator().manual_seed(0)) > 0.3,
         "window": torch.tensor([40, 31]), "block_causal": torch.tensor([13, 27]),
         "prefix_lm": torch.tensor([5, 17])}[kind]
    build = {"padding": lambda x: masks.padding(key_lengths=x),
             "document": lambda x: masks.document(x),
             "from_dense": lambda x: masks.from_dense(x),
             "window": lambda x: masks.window(5, 0, "bottom_right", query_lengths=x),
             "block_causal": lambda x: masks.block_causal(x),
             "prefix_lm": lambda x: masks.prefix_lm(x)}[kind]
    m, frozen = build(t), build(t.clone())
    want = frozen.to_dense(L, L)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, L, 8, generator=g) for _ in range(3))
    first = attnlab.attention(q, k, v, mask=m, backend="tiled")  # intervals/tiles cached now
    if t.dtype == torch.bool:
        t.logical_not_()
    else:
        t.copy_(t.flip(0) // 2 if kind != "document" else torch.arange(L) // 4)
    assert torch.equal(m.to_dense(L, L), want)
    for backend in ("auto", "tiled", "math"):
        out = attnlab.attention(q, k, v, mask=m, backend=backend)
        assert (out - first).abs().max() < 1e-5, backend


def test_from_dense_of_a_broadcast_row_stays_one_row():
    row = torch.rand(1, 4096) > 0.5
    m = masks.from_dense(row.expand(4096, 4096))
    assert m.tensor.untyped_storage().nbytes() == 4096  # a copy of the row, not of the matrix
    assert m.tensor.data_ptr() != row.data_ptr()


def test_block_lengths_past_int64_are_refused():
    """Issue 35 item 12: the lengths' sum is checked before a cumulative sum can wrap."""
    with pytest.raises(AttnlabError, match="query_lengths"):
        masks.block_causal([2**62, 2**62])
    with pytest.raises(AttnlabError, match="key_lengths"):
        masks.block_diagonal([4], [2**63 - 1])


def test_alibi_lengths_longer_than_the_call_are_refused():
    """Issue 35 item 12: alibi(..., query_lengths=[99]) at L = 4 is an error, as for masks."""
    import attnlab

    q = torch.randn(1, 2, 4, 8)
    for kw in ({"query_lengths": [99]}, {"key_lengths": [5]}):
        mod = masks.alibi(torch.ones(2), align="bottom_right", **kw)
        with pytest.raises(AttnlabError, match="exceed the padded length"):
            attnlab.attention(q, q, q, score_mod=mod)
    ok = masks.alibi(torch.ones(2), align="bottom_right", query_lengths=[4], key_lengths=[3])
    assert attnlab.attention(q, q, q, score_mod=ok).isfinite().all()


def test_a_union_across_a_one_key_gap_has_no_intervals():
    """Row i: keys [0, i] | {i + S - L}. S - L = 2 leaves key i + 1 out (two runs: no
    intervals); S - L = 1 touches (one run, [0, i + 2))."""
    m = masks.causal() | masks.window(0, 0, "bottom_right")
    assert m.intervals(4, 6) is None
    lo, hi = m.intervals(4, 5)
    j = torch.arange(5)
    assert torch.equal((j >= lo[..., None]) & (j < hi[..., None]), m.to_dense(4, 5))
