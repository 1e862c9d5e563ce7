"""One spawned group of 4 gloo processes serves the distributed test modules (spawning costs
seconds); smaller worlds run on subgroups of it. The slow half of the case matrix gets a second
group, started only when a slow test asks for it."""

import pytest


@pytest.fixture(scope="session")
def cp_results():
    """{case id: (rank 0's result, rank 1's, ...)} of the fast cases, plus "_errors"."""
    return _run(slow=False)


@pytest.fixture(scope="session")
def cp_results_slow():
    return _run(slow=True)


def _run(slow: bool) -> dict:
    from distributed.cases import run_exact
    from distributed.harness import run_group

    per_rank = run_group(run_exact, 4, slow)
    out: dict = {}
    for d in per_rank:
        for cid, res in d.items():
            out.setdefault(cid, []).append(res)
    return out
