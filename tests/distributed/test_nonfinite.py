"""NaN/Inf anywhere in q, k or v across processes gives what one process gives: the 405 cases of
every layout × strategy × mask × {NaN, +inf, −inf} × {q, k, v} at P = 2, forward and backward.

The rule (`attnlab.ops.nonfinite`): a row is NaN exactly when its query holds NaN/Inf and it may
attend something, or it may attend a key position whose key or value holds NaN/Inf (under a
mask); every other entry is computed as if the poisoned entries were zeros."""

import pytest

from distributed.nonfinite_cases import nonfinite_cases

CASES = nonfinite_cases()


@pytest.fixture(scope="module")
def nonfinite_results():
    from distributed.harness import run_group
    from distributed.nonfinite_cases import run_nonfinite

    per_rank = run_group(run_nonfinite, 2, timeout_s=300.0)
    return {cid: [d[cid] for d in per_rank] for cid in per_rank[0]}


def test_matrix_has_405_cases():
    assert len(CASES) == 405 == len({c["id"] for c in CASES})


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_nonfinite_matches_one_process(case, nonfinite_results):
    per_rank = nonfinite_results[case["id"]]
    for rank, r in enumerate(per_rank):
        assert "error" not in r, f"rank {rank}: {r.get('error')}"
        for what in ("out", "lse", "dq", "dk", "dv"):
            pattern, err = r[what]
            assert pattern == 0, f"rank {rank} {what}: {pattern} entries differ in NaN/inf"
            assert err <= 1e-10, f"rank {rank} {what}: relative error {err:.3e}"
    if case["where"] == "q" or case["mask"] != "none":
        assert sum(r["nan_rows"] for r in per_rank) > 0  # the poison did reach some row
