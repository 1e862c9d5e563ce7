"""benchmarks/ablate.py: one short run's table (nothing here is timed)."""

from __future__ import annotations

import pytest

from helpers import load_script


@pytest.fixture(scope="module")
def ab():
    yield from load_script("ablate")


@pytest.mark.slow  # 72 separate MiniLM runs
def test_one_repeat_prints_the_four_steps(ab, capsys, minilm):
    assert ab.main(["--threads", "1", "--repeats", "1"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| 1 |")]
    assert [r.split("|")[3].strip() for r in rows] == ["forward", "sweep", "plain batch",
                                                      "72 runs"]
    assert all(r.split("|")[2].strip() == "13" for r in rows)


def test_bad_numbers_are_refused(ab):
    with pytest.raises(SystemExit):
        ab.main(["--repeats", "0"])
