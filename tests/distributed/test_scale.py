"""Context parallelism at scale, exact in float64 against one process with bytes and messages
counted equal to `plan`: Ulysses with K/V heads replicated (GQA with fewer key/value heads than
ranks, MQA), hybrid Ulysses × ring (all-to-all over heads inside groups of U ranks, the ring
across groups), and the errors that name the head rule; one spawned group of 4 serves them all."""

import pytest

from distributed.harness import case_ranks, results_by_case
from distributed.scale_cases import all_cases

CASES = all_cases()


@pytest.fixture(scope="module")
def results():
    from distributed.scale_cases import GROUP_TIMEOUT_S, run_scale

    return results_by_case(run_scale, 4, GROUP_TIMEOUT_S)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_fp64_equals_one_process(case, results):
    per_rank = case_ranks(case, results)
    assert sum(r["rows"] for r in per_rank) == case["L"]
    for rank, r in enumerate(per_rank):
        for what in ("out", "lse", "dq", "dk", "dv"):
            assert r[what] <= 1e-10, f"rank {rank} {what}: relative error {r[what]:.3e}"


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bytes_and_messages_equal_plan(case, results):
    for rank, r in enumerate(case_ranks(case, results)):
        assert r["got"] == r["plan"], (
            f"rank {rank}: counted (bytes fwd sent, recv, bwd sent, recv, messages ...) "
            f"{r['got']}, plan {r['plan']}")


def test_uneven_heads_name_the_rule(results):
    for errs in results["_errors"]:
        msg = errs["uneven_heads"]
        assert msg.startswith("AttnlabError") and "H = 6 divisible by world = 4" in msg, msg


def test_hybrid_errors_name_the_rule(results):
    for errs in results["_errors"]:
        assert "needs ulysses_size=U" in errs["hybrid_no_size"], errs["hybrid_no_size"]
        assert "dividing world = 4, got 3" in errs["hybrid_bad_size"], errs["hybrid_bad_size"]
        assert "H = 6 divisible by ulysses_size U = 4" in errs["hybrid_uneven_heads"], \
            errs["hybrid_uneven_heads"]


def test_calibration_agrees_on_every_rank_and_drives_auto(results):
    import math

    per_rank = results["_calibration"]
    first = per_rank[0]
    for r in per_rank:
        assert r["one"] == first["one"] and r["two"] == first["two"]  # the slowest rank's
        assert r["phases"] == {"calibrate"}  # nothing counted as forward / backward
        assert "ulysses_size: expected a positive divisor of world = 4, got 3" in r["bad"]
        assert r["auto_sent"] == r["choice_sent"]  # auto ran what plan picks on those numbers
    assert per_rank[0]["pair"] == per_rank[1]["pair"] and per_rank[0]["pair"].world == 2
    for cal in (first["one"], first["two"]):
        assert cal.world == 4 and cal.backend == "gloo"
        for v in (cal.inter_gbps, cal.intra_gbps, cal.latency_us, cal.tflops):
            assert math.isfinite(v) and v >= 0
        assert cal.inter_gbps > 0 and cal.intra_gbps > 0 and cal.tflops > 0
    assert first["one"].ulysses_size is None and first["two"].ulysses_size == 2
    assert first["one"].intra_gbps == first["one"].inter_gbps  # one tier


VARLEN = [c for c in CASES if c["kind"] == "varlen"]


@pytest.mark.parametrize("case", VARLEN, ids=[c["id"] for c in VARLEN])
def test_varlen_moves_only_attendable_keys_and_unshards(case, results):
    """Forward, a rank receives exactly the other ranks' keys its queries may attend (point to
    point: ring, and allgather when not every rank needs every key) and unshard gives the whole
    packed output back."""
    for rank, r in enumerate(case_ranks(case, results)):
        assert r["unshard"] <= 1e-12
        if case["strategy"] != "ulysses":
            assert r["got"][1] == r["attendable_bytes"], f"rank {rank}"
