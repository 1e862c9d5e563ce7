"""Communication asserted, not printed: what every rank sent and received, bytes and messages,
counted by a wrapper around the torch.distributed calls, equals the cost model's prediction; the
ring receives exactly the keys its queries may attend, and mask-aware skipping computes exactly
the block pairs with something to attend."""

import pytest

from distributed.cases import exact_cases

CASES = exact_cases()


def _params(cases):
    return [pytest.param(c, id=c["id"], marks=[pytest.mark.slow] if c["slow"] else [])
            for c in cases]


def _results(c, request):
    return request.getfixturevalue("cp_results_slow" if c["slow"] else "cp_results")[c["id"]]


@pytest.mark.parametrize("case", _params(CASES))
def test_bytes_equal_plan(case, request):
    for rank, r in enumerate(_results(case, request)):
        got = (r["fwd_sent"], r["fwd_recv"], r["bwd_sent"], r["bwd_recv"])
        assert got == tuple(r["plan"]), f"rank {rank}: logged {got}, plan {r['plan']}"


@pytest.mark.parametrize("case", _params(CASES))
def test_messages_equal_plan(case, request):
    for rank, r in enumerate(_results(case, request)):
        assert r["msgs"] == tuple(r["plan_msgs"]), (
            f"rank {rank}: logged (fwd sent, fwd recv, bwd sent, bwd recv) messages "
            f"{r['msgs']}, plan {r['plan_msgs']}")


RING = [c for c in CASES if c["strategy"] == "ring"]


@pytest.mark.parametrize("case", _params(RING))
def test_ring_receives_only_keys_its_queries_may_attend(case, request):
    """Forward, a rank receives each key of another rank that some of its queries may attend
    (evaluated densely), once, and nothing else: no shard passes through on its way."""
    for rank, r in enumerate(_results(case, request)):
        assert r["fwd_recv"] == r["rows_attendable"] * r["row_bytes"], (
            f"rank {rank}: received {r['fwd_recv'] // r['row_bytes']} key rows, its queries "
            f"may attend {r['rows_attendable']} of the other ranks'")


@pytest.mark.parametrize("case", _params(RING))
def test_ring_computes_only_pairs_with_something_to_attend(case, request):
    for rank, r in enumerate(_results(case, request)):
        assert r["pairs"] == r["expected_pairs"], f"rank {rank}"


def _one(request, **want):
    (c,) = [c for c in CASES if all(c[k] == v for k, v in want.items())]
    return _results(c, request)


def test_ring_zigzag_causal_every_rank_sends_to_every_other(request):
    per_rank = _one(request, P=4, layout="zigzag", strategy="ring", mask="causal", L=37,
                    heads="gqa")
    for rank, r in enumerate(per_rank):
        assert r["fwd_sends"] == 2 * 3  # k and v to each of the P - 1 others
        assert sorted(r["fwd_to"]) == [p for p in range(4) if p != rank]
    # L = 37 in 8 chunks of 5 (the last 2): rank 3 (chunks 3, 4: tokens 15-24) needs chunk o of
    # each rank o < 3, never the late chunks 5-7, so it receives 3 x 5 rows, not 3 shards
    row = per_rank[3]["row_bytes"]
    assert per_rank[3]["fwd_from"] == {0: 5 * row, 1: 5 * row, 2: 5 * row}


def test_ring_causal_contiguous_rank0_receives_nothing(request):
    per_rank = _one(request, P=4, layout="contiguous", strategy="ring", mask="causal", L=37,
                    heads="gqa")
    row = per_rank[0]["row_bytes"]
    assert per_rank[0]["fwd_recv"] == 0 and per_rank[0]["fwd_from"] == {}
    for rank in (1, 2, 3):  # every earlier shard of 10 keys, straight from its owner
        assert per_rank[rank]["fwd_from"] == {s: 10 * row for s in range(rank)}
    assert per_rank[3]["fwd_to"] == {}


def test_ring_sliding_window_exchanges_only_neighbour_halos(request):
    """W = 5, L = 37 in contiguous shards of 10: rank r receives the W - 1 = 4 last keys of rank
    r - 1 and nothing else."""
    per_rank = _one(request, P=4, layout="contiguous", strategy="ring", mask="sliding", L=37,
                    heads="gqa")
    row = per_rank[0]["row_bytes"]
    assert [r["fwd_from"] for r in per_rank] == [{}, {0: 4 * row}, {1: 4 * row}, {2: 4 * row}]
    assert [r["fwd_to"] for r in per_rank] == [{1: 4 * row}, {2: 4 * row}, {3: 4 * row}, {}]


@pytest.mark.parametrize("strategy", ["ring", "allgather"])
def test_document_mask_talks_only_to_ranks_sharing_a_document(request, strategy):
    """Documents 0-9, 10-24, 25-36 over contiguous shards of 10 (causal inside each): rank 0
    shares none and exchanges nothing; rank 2 needs rank 1's part of document 1, rank 3 rank 2's
    part of document 2."""
    per_rank = _one(request, P=4, layout="contiguous", strategy=strategy, mask="docshard")
    row = per_rank[0]["row_bytes"]
    assert [r["fwd_from"] for r in per_rank] == [{}, {}, {1: 10 * row}, {2: 5 * row}]
    assert per_rank[0]["fwd_to"] == {} and per_rank[0]["bwd_sent"] == 0


@pytest.mark.parametrize("strategy", ["ring", "allgather"])
def test_sliding_window_moves_only_halos(request, strategy):
    """W = 64 at L = 4096 over 4 ranks: each rank fetches W - 1 = 63 keys from its left
    neighbour (rank 0 none), instead of a ring of 3 shards of 1024."""
    per_rank = _one(request, mask="sliding64", strategy=strategy)
    row = 1 * 1 * (32 + 32) * 8  # B·Hkv·(D + Dv)·bytes, fp64
    assert [r["fwd_recv"] for r in per_rank] == [0, 63 * row, 63 * row, 63 * row]
    assert [r["fwd_sent"] for r in per_rank] == [63 * row, 63 * row, 63 * row, 0]
    ring_fwd = 3 * 1024 * row
    assert max(r["fwd_recv"] for r in per_rank) * 16 < ring_fwd


def test_causal_rank0_fetches_nothing_with_allgather(request):
    per_rank = _one(request, P=4, layout="contiguous", strategy="allgather", mask="causal",
                    L=37, heads="gqa")
    assert per_rank[0]["fwd_recv"] == 0
    assert per_rank[3]["fwd_recv"] > per_rank[1]["fwd_recv"] > 0
