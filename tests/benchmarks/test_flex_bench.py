"""benchmarks/flex.py: one tiny run of each table (nothing here is timed; torch.compile makes
it slow)."""

from __future__ import annotations

import pytest

from helpers import load_script


@pytest.fixture(scope="module")
def fb():
    yield from load_script("flex")


@pytest.mark.slow
def test_a_tiny_run_prints_both_masks_and_their_one_off_costs(fb, capsys):
    assert fb.main(["--L", "256", "--window", "32", "--docs", "3", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    rows = [r for r in out.splitlines() if r.startswith(("| sliding", "| 3 documents"))]
    assert len(rows) == 4 and all("nan" not in r for r in rows)
    assert all(r.count("|") == 10 for r in rows[:2]) and all(r.count("|") == 5 for r in rows[2:])


@pytest.mark.slow
def test_a_tiny_run_of_the_score_mod_table(fb, capsys):
    assert fb.main(["--mods", "--L", "256", "--window", "32", "--repeats", "1"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith(("| softcap",
                                                                             "| ALiBi"))]
    assert len(rows) == 2 and all(r.count("|") == 7 for r in rows)
