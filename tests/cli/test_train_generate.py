"""Train -> generate: a sample at each evaluation, a last line that is the next command, the
extra named at once when it is missing, and generate's usage showing --model as required."""

from __future__ import annotations

import importlib.util
import shlex

import pytest

from attnlab.cli import main


def test_train_samples_at_each_evaluation_and_ends_with_the_generate_command(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--preset", "tiny", "--max-steps", "4", "--eval-interval", "2",
            "--out", str(out)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    samples = [x for x in lines if "; sample: " in x]
    assert [x.split(":")[0] for x in samples] == ["step 2", "step 4"]
    assert all(" -> " in x for x in samples)
    last = shlex.split(lines[-1])
    assert last[:5] == ["next:", "attnlab", "generate", "--model", str(out)]
    assert last[5] == "--prompt" and last[6]
    assert main([*last[2:], "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith(last[6])


def test_train_without_the_extra_names_it_at_once(monkeypatch, capsys, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "safetensors" else real(name, *a))
    assert main(["train", "--preset", "tiny", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'attnlab[train]'" in err and "safetensors" in err
    assert not (tmp_path / "x").exists()


def test_generate_usage_shows_model_as_required(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    usage = " ".join(capsys.readouterr().out.split("\n\n")[0].split())
    assert usage.startswith("usage: attnlab generate [-h] --model DIR --prompt TEXT")
    with pytest.raises(SystemExit) as stop:
        main(["generate", "--prompt", "x"])
    assert stop.value.code == 2 and "--model is required" in capsys.readouterr().err
