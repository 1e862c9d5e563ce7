"""Packed sequences on paper: the head-tail split of every document, its load balance against
the plain layouts under the same document mask, exact transfer sets, and the errors. (Exactness
against one process and bytes == plan on running groups: test_scale.py.)"""

import pytest
import torch

import attnlab.distributed as cp
from attnlab import masks
from attnlab.distributed.varlen import DocumentSharding, VarlenGeometry
from attnlab.errors import AttnlabError


def test_each_document_goes_head_and_tail_to_every_rank():
    # documents of 8 and 4 tokens over 2 ranks: chunks of 2 and of 1
    sh = DocumentSharding((0, 8, 12), 2)
    assert sh.positions(0).tolist() == [0, 1, 6, 7, 8, 11]
    assert sh.positions(1).tolist() == [2, 3, 4, 5, 9, 10]
    assert cp.varlen_shard(torch.arange(12.0)[None, None, :, None], [0, 8, 12]).flatten() \
        .tolist() == list(range(12))  # one process: everything, in order
    short = DocumentSharding((0, 3), 4)  # 3 tokens, 8 chunks of 1: ranks 0-2 the heads
    assert [short.positions(r).tolist() for r in range(4)] == [[0], [1], [2], []]


def test_per_document_balance_beats_the_plain_layouts():
    """Documents of very different lengths, causal inside each: per-document head-tail keeps
    the work within a few % of even; zigzag over the packed sequence does not."""
    cu = [0, 3000, 3500, 7600, 8192]
    ids = DocumentSharding(tuple(cu), 1).doc_of
    v = cp.varlen_plan(cu, 8, 8, 64, 4, dtype="fp32")
    z = cp.plan(8192, 8, 8, 64, 4, mask=masks.document(ids), is_causal=True, layout="zigzag",
                dtype="fp32")
    assert v["ring"].load < 1.02 < 1.1 < z["ring"].load
    assert sum(v["ring"].flops_fwd) == pytest.approx(sum(z["ring"].flops_fwd), rel=0.01)


def test_transfer_sets_are_exact_per_document():
    cu = (0, 5, 18, 18, 37)
    g = VarlenGeometry(37, 37, 4, "documents", cp.cost.effective_mask(
        masks.document(DocumentSharding(cu, 1).doc_of), True), cu=cu, causal=True)
    dense = g.mask.to_dense(37, 37)[0, 0]  # (L, S)
    for r in range(4):
        mine = g.q.positions(r)
        for s in range(4):
            theirs = g.k.positions(s)
            want = torch.nonzero(dense[mine][:, theirs].any(0)).flatten() if len(mine) else []
            assert g.rows_needed(r, s).tolist() == list(map(int, want)), (r, s)


@pytest.mark.parametrize("cu", [[1, 5], [0, 5, 3], [0], [0, 0], [0, 2.5], "x", [0, True]])
def test_bad_offsets_name_the_argument(cu):
    with pytest.raises(AttnlabError, match="cu_seqlens"):
        cp.varlen_plan(cu, 4, 4, 16, 2)


def test_shard_checks_the_length():
    with pytest.raises(AttnlabError, match=r"x: expected 12 rows \(cu_seqlens\[-1\]\)"):
        cp.varlen_shard(torch.zeros(1, 1, 11, 4), [0, 8, 12])


def test_one_process_equals_attention():
    import attnlab

    cu = [0, 5, 13, 20]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 20, 8, generator=g, dtype=torch.float64) for _ in range(3))
    ids = DocumentSharding(tuple(cu), 1).doc_of
    want = attnlab.attention(q, k, v, mask=masks.document(ids), is_causal=True)
    got = cp.varlen_attention(q, k, v, cu)
    assert torch.allclose(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("kw, msg", [(dict(strategy="hybrid"), "strategy: expected one of"),
                                     (dict(causal=1), "causal: expected a bool"),
                                     (dict(cu=[0, 5, 19]), "cu_seqlens \\(L = 19\\)")])
def test_varlen_attention_errors_name_the_argument(kw, msg):
    x = torch.zeros(1, 2, 20, 8)
    cu = kw.pop("cu", [0, 5, 20])
    with pytest.raises(AttnlabError, match=msg):
        cp.varlen_attention(x, x, x, cu, **kw)
