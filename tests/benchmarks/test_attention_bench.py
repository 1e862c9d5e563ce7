"""The benchmark engine: FLOP counting matches the masks, and one tiny run prints every column.
(Benchmarks are scripts; nothing here is timed.)"""

from __future__ import annotations

import pytest

from attnlab.bench import engine as br
from attnlab.cli import main


@pytest.mark.parametrize("mask", br.MASKS)
@pytest.mark.parametrize("L", [1, 100, 300, 1024])
def test_pairs_count_the_unmasked_entries(mask, L):
    case = br.Case(L=L, mask=mask, dtype="fp32", mode="fwd")
    m = br.structured_mask(case)
    want = L * L if m is None else int(m.to_dense(L, L).sum())
    assert case.pairs == want
    assert br.Case(L=L, mask=mask, dtype="fp32", mode="fwd+bwd").flops == 3.5 * case.flops


def test_tiny_run_prints_all_impls(capsys):
    rc = main(["bench", "--L", "64", "96", "--masks", "sliding256", "document8", "--modes",
               "fwd", "fwd+bwd", "--dtypes", "fp32", "--peers", "sdpa", "naive", "--tiled",
               "--repeats", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = [r for r in out.splitlines() if r.startswith("| 64 ") or r.startswith("| 96 ")]
    # 2 lengths x 2 masks x 2 modes x (attnlab, tiled, sdpa, naive) + weights rows for fwd
    assert len(rows) == 2 * 2 * 2 * 4 + 2 * 2
    assert all(r.count("|") == 11 for r in rows)
    assert "auto→" in out and "attention_weights" in out


def test_bad_arguments_exit_2(capsys):
    assert main(["bench", "--L", "0"]) == 2
    assert "--repeats and --L must be positive" in capsys.readouterr().err
