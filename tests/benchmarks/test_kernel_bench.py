"""benchmarks/kernel.py: its timing helpers and one tiny run's tables (nothing here is timed)."""

from __future__ import annotations

import pytest
import torch

from attnlab.ops import kernels

from helpers import load_script


@pytest.fixture(scope="module")
def kb():
    yield from load_script("kernel")


def test_cells_say_dash_where_there_was_no_run(kb):
    nan = float("nan")
    assert kb.ms(nan, "compiled Flex") == "–" and kb.ratio(nan, 0.1) == "–"
    assert kb.ms(0.0714, "SDPA") == "71 SDPA" and kb.ms(0.0714) == "71"
    assert kb.ratio(0.2, 0.1) == "2.00"


def test_thread_counts_alternate_call_by_call(kb):
    n = torch.get_num_threads()
    seen = []
    try:
        t = kb.med_threads(lambda: seen.append(torch.get_num_threads()), 3)
    finally:
        torch.set_num_threads(n)
    assert seen == [1, 2] * 4  # a warm-up of each, then 3 timed pairs
    assert set(t) == {1, 2} and all(v >= 0 for v in t.values())


@pytest.mark.skipif(not kernels.available(), reason="the interval kernel is not built here")
def test_a_quick_forward_run_prints_one_row_per_case(kb, capsys):
    n = torch.get_num_threads()
    try:
        assert kb.main(["--quick", "--only", "fwd", "weights", "--repeats", "1"]) == 0
    finally:
        torch.set_num_threads(n)
    out = capsys.readouterr().out
    rows = [r for r in out.splitlines() if r.startswith(("| window", "| 8 documents", "| causal"))]
    assert len(rows) == 3 + 2  # the forward table's cases, then the weights table's two
    assert "nan" not in out and "FMA ceiling" in out
    width = rows[0].count("|")
    assert all(r.count("|") == width for r in rows[:3])
