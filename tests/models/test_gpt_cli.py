"""`attnlab train` and `attnlab generate`: the README flow, and bad arguments as one clear line."""

from __future__ import annotations

import pytest

from attnlab.cli import main
from attnlab.models import is_checkpoint, load_checkpoint


def one_line_error(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"attnlab {argv[0]}: error: ")
    for n in needles:
        assert n in err, err


def test_train_resume_generate(tmp_path, capsys):
    out = str(tmp_path / "tiny")
    assert main(["train", "--preset", "tiny", "--max-steps", "2", "--out", out, "--quiet"]) == 0
    assert "step 2: train loss" in capsys.readouterr().out and is_checkpoint(out)
    assert main(["train", "--out", out, "--resume", "--max-steps", "3", "--quiet"]) == 0
    assert "step 3: train loss" in capsys.readouterr().out
    model, _ = load_checkpoint(out)
    assert model.config.name == "tiny"
    argv = ["generate", "--model", out, "--prompt", "To be", "--max-new-tokens", "20",
            "--temperature", "1.0", "--top-k", "5", "--seed", "3"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first and first.startswith("To be") and len(first) == 26
    one_line_error(capsys, ["train", "--out", out, "--quiet"], "already holds a checkpoint",
                   "--resume")
    one_line_error(capsys, ["generate", "--model", out, "--prompt", "café"], "--prompt",
                   "'é'")
    one_line_error(capsys, ["generate", "--model", out, "--prompt", "a", "--top-k", "0"],
                   "top_k")
    for flag, value, needle in (("--temperature", "inf", "temperature: expected a finite"),
                                ("--temperature", "nan", "temperature: expected a finite"),
                                ("--seed", str(10**24), "seed: expected an int of magnitude"),
                                ("--max-new-tokens", str(10**12), "max_new_tokens: expected")):
        one_line_error(capsys, ["generate", "--model", out, "--prompt", "a", flag, value],
                       needle)


@pytest.mark.parametrize("argv, needles", [
    (["generate", "--model", "/nonexistent/ck", "--prompt", "hi"],
     ["no attnlab checkpoint at '/nonexistent/ck'"]),
    (["train", "--preset", "enormous"], ["--preset: unknown 'enormous'", "tiny"]),
    (["train", "--max-steps", "0"], ["--max-steps"]),
])
def test_bad_arguments_give_one_clear_line(capsys, argv, needles):
    one_line_error(capsys, argv, *needles)


def test_resume_without_a_checkpoint(tmp_path, capsys):
    one_line_error(capsys, ["train", "--out", str(tmp_path), "--resume"], "--resume",
                   "no checkpoint")


@pytest.mark.parametrize("args, needle", [
    (["--lr", "1e308"], "lr: 1e+308 is beyond the limit of 1e+30"),
    (["--threads", "100000000"], "--threads: 100000000 is beyond the limit of 1024"),
    (["--nproc", "100000"], "--nproc: 100000 is beyond the limit of 1024"),
    (["--max-steps", str(10**12)], "max_steps: 1e+12 is beyond the limit"),
    (["--batch-size", str(10**12)], "batch_size: 1e+12 is beyond the limit"),
])
def test_out_of_range_numbers_are_one_line_before_training(tmp_path, capsys, args, needle):
    one_line_error(capsys, ["train", "--out", str(tmp_path / "r"), "--quiet", *args], needle)
    assert not (tmp_path / "r" / "attnlab.json").exists()
