"""`attnlab train`'s header line says when the training windows are partly repeated text."""

from __future__ import annotations

from attnlab.cli import main


def _header(capsys, tmp_path, preset: str) -> str:
    rc = main(["train", "--preset", preset, "--out", str(tmp_path / preset), "--max-steps", "1",
               "--batch-size", "2", "--eval-interval", "1", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 0
    return next(line for line in err.splitlines() if line.startswith("attnlab train: preset"))


def test_the_induction_preset_says_its_windows_are_partly_repeated_text(capsys, tmp_path):
    line = _header(capsys, tmp_path, "induction")
    assert "50% of training windows repeated text (repeat_prob 0.5" in line
    assert "train loss is not plain-corpus loss" in line
    assert line.endswith(f"steps 0 -> 1, checkpoints in {tmp_path / 'induction'}")


def test_a_plain_corpus_preset_says_nothing_of_repeats(capsys, tmp_path):
    line = _header(capsys, tmp_path, "tiny")
    assert "repeat" not in line and "corpus 'shakespeare'" in line
