"""benchmarks/small_calls.py: one tiny run's table (nothing here is timed)."""

from __future__ import annotations

import pytest
import torch

from helpers import load_script


@pytest.fixture(scope="module")
def sc():
    yield from load_script("small_calls")


def test_a_tiny_run_prints_one_row_per_threads_and_length(sc, capsys):
    n = torch.get_num_threads()
    assert sc.main(["--L", "8", "24", "--threads", "1", "--repeats", "2"]) == 0
    assert torch.get_num_threads() == n  # put back
    out = capsys.readouterr().out.splitlines()
    rows = [r for r in out if r.startswith("| 1 |")]
    assert [r.split("|")[3].strip() for r in rows] == ["8", "24"]
    assert "load" in out[0] and out[-1].startswith("# load")  # what shared the cores
    assert all(r.count("|") == 12 and "nan" not in r for r in rows)


def test_masks_and_clocks(sc, capsys):
    assert sc.main(["--L", "4", "--threads", "1", "--repeats", "2", "--masks", "causal", "none",
                    "--clock", "cpu"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| 1 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["causal", "none"]


def test_bad_numbers_are_refused(sc):
    with pytest.raises(SystemExit):
        sc.main(["--repeats", "0"])


def test_each_pair_swaps_places_every_other_repeat(sc):
    seen = []
    steps = {name: (lambda n=name: seen.append(n)) for name in ("a", "s", "ab", "sb")}
    sc.medians(steps, 2, clock=lambda: 0.0)
    bursts = [seen[i] for i in range(4 * 5, len(seen), sc.BURST)]  # after the warm-up calls
    assert bursts == ["a", "s", "ab", "sb", "s", "a", "sb", "ab"]  # each after a backward once
