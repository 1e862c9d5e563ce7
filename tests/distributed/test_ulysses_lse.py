"""Ulysses runs the same collectives on every rank whatever its loss uses: the lse's gradient
travels with the output's in one all-to-all, zeros where a loss leaves it out, so a loss of the
lse on rank 0 alone and of the output alone on the others completes (the group times out in
seconds if not) with float64 gradients equal to one process's, and the counted bytes and messages
equal `plan` whether or not the loss uses the lse."""

import pytest

from distributed.harness import case_ranks, results_by_case
from distributed.ulysses_lse_cases import ulysses_cases

CASES = ulysses_cases()


@pytest.fixture(scope="module")
def results():
    from distributed.ulysses_lse_cases import GROUP_TIMEOUT_S, run_ulysses

    return results_by_case(run_ulysses, 4, GROUP_TIMEOUT_S)


FP64 = [c for c in CASES if c["dtype"] == "fp64"]


@pytest.mark.parametrize("case", FP64, ids=[c["id"] for c in FP64])
def test_gradients_equal_one_process(case, results):
    per_rank = case_ranks(case, results)
    assert sum(r["rows"] for r in per_rank) == case["L"]
    for rank, r in enumerate(per_rank):
        for what in ("out", "lse", "dq", "dk", "dv"):
            if what in r:
                assert r[what] <= 1e-10, f"rank {rank} {what}: relative error {r[what]:.3e}"


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bytes_and_messages_equal_plan(case, results):
    for rank, r in enumerate(case_ranks(case, results)):
        assert r["got"] == r["plan"], (
            f"rank {rank}: counted (fwd sent, recv, bwd sent, recv; then messages) {r['got']}, "
            f"plan {r['plan']}")


def _geometry(c):
    return tuple(c[k] for k in ("P", "layout", "mask", "L", "H", "Hkv", "dtype"))


@pytest.mark.parametrize("case", [c for c in CASES if c["loss"] == "out"],
                         ids=[c["id"][4:] for c in CASES if c["loss"] == "out"])
def test_every_loss_moves_the_same(case, results):
    """A loss of the output alone, of both and a mix across ranks count the same bytes and
    messages; the backward carries the lse gradient (B·H·n values, accumulation dtype) always, as
    many bytes as the forward."""
    same = [c for c in CASES if _geometry(c) == _geometry(case)]
    assert [c["loss"] for c in same] == ["out", "both", "mixed"]
    counted = [[r["got"] for r in case_ranks(c, results)] for c in same]
    assert counted[0] == counted[1] == counted[2]
    for r in case_ranks(case, results):
        fwd_sent, fwd_recv, bwd_sent, bwd_recv = r["got"][:4]
        assert bwd_sent == fwd_sent == bwd_recv == fwd_recv > r["lse_bwd_bytes"] > 0


BF16 = [c for c in CASES if c["dtype"] == "bf16"]


@pytest.mark.parametrize("case", BF16, ids=[c["id"] for c in BF16])
def test_bf16_output_and_fp32_lse_in_one_message(case, results):
    """out (bf16) and lse (fp32, as pairs of bf16) share one all-to-all: both arrive intact, the
    lse to fp32 accuracy (a half of its bits lost or swapped would be far off)."""
    for rank, r in enumerate(case_ranks(case, results)):
        for what in ("out", "lse", "dq", "dk", "dv"):
            if what in r:
                tol = 1e-4 if what == "lse" else 2e-2
                assert r[what] <= tol, f"rank {rank} {what}: relative error {r[what]:.3e}"
