"""attnlab.distributed.spawn: results in rank order; the first rank that fails, dies or runs out
of time is a SpawnError naming it, and the caller never waits for a stuck group. (The spawned
group of tests/distributed/conftest.py runs through it too.)"""

import pytest

from attnlab.distributed import SpawnError, spawn
from attnlab.errors import AttnlabError
from distributed import workers


def test_results_in_rank_order_through_the_group():
    assert spawn(workers.ranks, 2, "x", timeout_s=120) == [(0, 2, "x", [0.0, 1.0]),
                                                            (1, 2, "x", [0.0, 1.0])]


def test_first_failing_rank_is_the_error_while_the_others_wait():
    """Rank 0 sits in a collective for rank 1 until a group timeout of 300 s; spawn does not wait
    for that (nor for its own 120 s): rank 1's exception is the error, with its traceback."""
    with pytest.raises(SpawnError, match="rank 1 of 2 failed: ValueError: rank 1 gives up") as e:
        spawn(workers.one_raises, 2, timeout_s=120, group_timeout_s=300)
    assert e.value.rank == 1 and "Traceback" in str(e.value) and "one_raises" in str(e.value)


@pytest.mark.slow
def test_a_case_failing_on_one_rank_stops_the_group_at_once():
    """A case of the harness that raises on one rank only: that rank stops, naming the case, and
    the group goes down long before its 60 s timeout; before, the rank went on to case "b",
    whose collective rank 0's case "a" then took for its own (a wrong pairing, no error)."""
    import time

    t0 = time.monotonic()
    with pytest.raises(SpawnError, match="case a failed on rank 1: ValueError") as e:
        spawn(workers.one_case_raises, 2, timeout_s=120, group_timeout_s=60)
    assert e.value.rank == 1 and time.monotonic() - t0 < 40


@pytest.mark.slow
def test_a_rank_that_dies_is_named():
    with pytest.raises(SpawnError, match="rank 1 of 2 exited with code 3") as e:
        spawn(workers.one_exits, 2, timeout_s=120)
    assert e.value.rank == 1


@pytest.mark.slow
def test_a_stuck_group_is_stopped_at_the_timeout():
    with pytest.raises(SpawnError, match=r"did not finish in 2 s \(ranks \[0, 1\] still running"):
        spawn(workers.sleeps, 2, timeout_s=2)


@pytest.mark.parametrize("kw, name", [(dict(world=0), "world"), (dict(timeout_s=0), "timeout_s"),
                                      (dict(threads=True), "threads")])
def test_bad_arguments(kw, name):
    args = dict(world=2) | kw
    world = args.pop("world")
    with pytest.raises(AttnlabError, match=name):
        spawn(workers.sleeps, world, **args)


def test_a_rank_that_skips_its_backward_is_named_by_the_library():
    """The rank that waits raises an AttnlabError naming the silent peer and what it skipped."""
    msg, other = spawn(workers.skips_backward, 2, True, timeout_s=120, group_timeout_s=10)
    assert other == "returned"
    assert "rank 1 did not run the backward of context_parallel_attention call 3" in msg, msg
    assert "rank 0 waited" in msg and "key/value" in msg


def test_a_rank_that_skips_its_backward_is_named_by_spawn():
    with pytest.raises(SpawnError, match="rank 1 of 2 returned without running the backward "
                                         "of context_parallel_attention call 3") as e:
        spawn(workers.skips_backward, 2, False, timeout_s=120, group_timeout_s=10)
    assert e.value.rank == 1 and "rank 0 waited" in str(e.value)
