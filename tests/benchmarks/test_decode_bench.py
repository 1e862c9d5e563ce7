"""benchmarks/decode.py: one tiny run of each table (nothing here is timed)."""

from __future__ import annotations

import pytest
import torch

from attnlab.ops import kernels

from helpers import load_script


@pytest.fixture(scope="module")
def dec():
    yield from load_script("decode")


def test_a_tiny_run_prints_one_row_per_case(dec, capsys):
    n = torch.get_num_threads()
    assert dec.main(["--heads", "4/2", "--D", "16", "--S", "300", "--dtype", "fp32", "bf16",
                     "--threads", "1", "--repeats", "1"]) == 0
    assert torch.get_num_threads() == n  # put back
    out = capsys.readouterr().out.splitlines()
    rows = [r for r in out if r.startswith("| 1 |")]
    assert [r.split("|")[6].strip() for r in rows] == ["fp32", "bf16"]
    assert "load" in out[0] and all(r.count("|") == 18 and "nan" not in r for r in rows)


def test_two_thread_rows_time_one_thread_too(dec, capsys):
    n = torch.get_num_threads()
    assert dec.main(["--heads", "4/2", "--D", "16", "--S", "300", "--dtype", "fp32",
                     "--threads", "2", "--repeats", "1"]) == 0
    assert torch.get_num_threads() == n
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| 2 |")]
    assert len(rows) == 1 and float(rows[0].split("|")[15]) > 0  # × 1 thread
    dec.quiet_threads(0.001)  # returns within its limit whatever runs


@pytest.mark.skipif(not kernels.available(), reason="the compiled kernel")
def test_a_tiny_growing_loop_prints_the_glue_per_step(dec, capsys):
    assert dec.main(["--grow", "3", "--heads", "4/2", "--D", "16", "--S", "300", "--dtype",
                     "bf16"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [r for r in out if r.startswith("| 4/2 |")]
    assert len(rows) == 1 and rows[0].count("|") == 10
    cells = [c.strip() for c in rows[0].split("|")[1:-1]]
    assert cells[:5] == ["4/2", "16", "300", "bf16", "3"]
    assert int(cells[5]) > 0 and int(cells[6]) > 0 and cells[8].endswith("%")
