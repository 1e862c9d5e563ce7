"""Bad input to the commands that run a model is one line on stderr and exit 2, found before the
model loads (loading and running take seconds): a text that is not UTF-8, a --file that is
binary, an output folder that does not exist."""

from __future__ import annotations

import pytest

from attnlab.cli import main
from attnlab.explain import model as explain_model

NOT_UTF8 = "caf\udce9"  # what Python makes of the bytes caf\xe9 on a command line


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: every check here must come before it."""
    def load_model(*_args, **_kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(explain_model, "load_model", load_model)


def _one_line_error(capsys, args, message):
    rc = main(args)
    _, err = capsys.readouterr()
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("args", [
    ["heads", NOT_UTF8],
    ["rollout", NOT_UTF8, "--token", "x"],
    ["rollout", "the cat", "--token", NOT_UTF8],
    ["view", NOT_UTF8, "-o", "page.html"],
    ["view", "the cat", "-o", "page.html", "--token", NOT_UTF8],
    ["explain", NOT_UTF8, "--token", "x"],
    ["explain", "the cat", "--token", NOT_UTF8],
    ["explain", "the cat", "--token", "x", "--target", NOT_UTF8],
    ["plot", NOT_UTF8, "-o", "x.png"],
])
def test_a_text_that_is_not_utf8_is_one_line(capsys, no_model, tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    _one_line_error(capsys, args, "not UTF-8 text (byte 0xe9 at character 3")


def test_a_binary_file_of_texts_is_one_line(capsys, no_model, tmp_path):
    binary = tmp_path / "texts.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    _one_line_error(capsys, ["heads", "--file", str(binary)], f"--file {binary}: not UTF-8 text")


def test_heads_checks_the_figure_folder_before_running_the_model(capsys, no_model, tmp_path):
    out = tmp_path / "missing" / "dir" / "x.png"
    _one_line_error(capsys, ["heads", "the cat sat", "-o", str(out)], "-o: no such directory")


@pytest.mark.parametrize("budget", ["nan", "inf", "0", "-3"])
def test_bench_budget_must_bound(capsys, budget):
    """--budget nan compared false with every prediction: no cell was ever skipped."""
    _one_line_error(capsys, ["bench", "--quick", "--budget", budget],
                    "--budget: expected a positive finite number of seconds")


@pytest.mark.parametrize(("args", "message"), [
    (["-o", "no/such/dir/x.png"], "-o: no such directory"),
    (["-o", "x.pdf"], "-o: expected a file ending in .png or .svg"),
    (["--stat", "nope"], "--stat 'nope': expected one of"),
])
def test_track_heads_checks_its_arguments_before_training(capsys, tmp_path, monkeypatch, args,
                                                          message):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    _one_line_error(capsys, ["track-heads", "--max-steps", "1", "--out", str(out), *args], message)
    assert not out.exists()
