"""benchmarks/gpu.py, the device check: it imports without a GPU, refuses to run without one
unless asked for its CPU dry run, and the dry run prints both tables and the targets.
(Nothing here is timed: the numbers of a dry run mean nothing.)"""

from __future__ import annotations

import pytest
import torch

from helpers import load_script


@pytest.fixture(scope="module")
def gpu():
    yield from load_script("gpu")


def test_dry_run_prints_tables_and_targets(gpu, capsys, tmp_path):
    rc = gpu.main(["--dry-run", "--masks", "causal", "fn_sliding256", "--modes", "fwd+bwd",
                   "--dtypes", "bf16", "--out", str(tmp_path / "check.md")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert (tmp_path / "check.md").read_text() == out  # the tables, also in the file
    speed = [r for r in out.splitlines() if r.startswith("| 256 ") or r.startswith("| 320 ")]
    assert len(speed) == 2 * 2 * 4  # lengths x masks x (attnlab, sdpa, flex, flash-attn)
    assert any("attnlab (auto→" in r for r in speed)
    exact = [r for r in out.splitlines() if r.startswith("| causal | bf16 | 192")
             or r.startswith("| fn_sliding256 | bf16 | 192")]
    assert len(exact) == 2 and all(r.endswith("| yes |") for r in exact)
    assert "causal fwd+bwd L=256 bf16" in out


def test_mask_definitions_agree(gpu):
    """The mask each peer gets is the mask attnlab gets (pairs counted for the FLOPs too)."""
    for name in gpu.MASKS:
        L = 700
        dense = gpu.dense_mask(name, L, "cpu")
        kw = gpu.attnlab_kwargs(name, L, "cpu")
        mine = kw["mask"].to_dense(L, L)[0, 0] if "mask" in kw else torch.ones(L, L).tril().bool()
        assert torch.equal(mine, dense), name
        assert gpu.pairs(name, L, "cpu") == int(dense.sum()), name


def test_a_spent_budget_lists_the_cases_left(gpu, capsys, tmp_path):
    rc = gpu.main(["--dry-run", "--masks", "causal", "--modes", "fwd", "--dtypes", "bf16",
                   "--no-exact", "--budget-s", "1e-9", "--out", str(tmp_path / "c.md")])
    out = capsys.readouterr().out
    assert rc == 0 and "skipped (the --budget-s" in out and "256 causal fwd bf16" in out


def test_without_a_device_it_says_so(gpu, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main(["--L", "64", "--out", str(tmp_path / "c.md")]) == 2
    assert "--dry-run" in capsys.readouterr().err
