"""The drawings `attnlab explain` and `attnlab lesson` add in a terminal, and when they appear."""

from __future__ import annotations

import io

import numpy as np
import pytest

from attnlab.cli import main
from attnlab.explain.lesson_sections import build_lesson
from attnlab.explain.token import explain_token
from attnlab.viz.lesson_text import render_lesson
from attnlab.viz.terminal import to_text, wanted
from attnlab.viz.terminal_reports import explain_drawing, lesson_drawing, show_lesson
from viz.fakes import fake_capture


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_wanted_only_on_a_terminal(monkeypatch):
    monkeypatch.delenv("TERM", raising=False)
    assert wanted(stream=Tty()) is True
    assert wanted(plain=True, stream=Tty()) is False
    assert wanted(stream=io.StringIO()) is False
    monkeypatch.setenv("TERM", "dumb")
    assert wanted(stream=Tty()) is False


def test_lesson_is_plain_text_when_piped(capsys):
    from attnlab.viz.lesson_text import intro

    assert main(["lesson"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(intro() + render_lesson(build_lesson()))
    assert "8. Past one head: \"it\" (token 8) through layer 2 of all-MiniLM-L6-v2" in out


def test_lesson_draws_in_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr("attnlab.viz.terminal.wanted", lambda plain=False, stream=None: not plain)
    assert main(["lesson", "--section", "scale"]) == 0
    out = capsys.readouterr().out
    assert "softmax after scaling by 0.707" in out and "█" in out
    assert "Weights sum to 1.000" in out  # the lesson's own text is still there
    assert main(["lesson", "--section", "scale", "--plain"]) == 0
    assert capsys.readouterr().out == render_lesson(build_lesson(["scale"]))


def test_lesson_drawings_match_numbers():
    sections = {s.name: s for s in build_lesson()}
    text = to_text(lesson_drawing(sections["scale"]))
    assert "93.6%" in text and "84.8%" in text
    causal = to_text(lesson_drawing(sections["mask"]))
    assert causal.count("·") >= 6  # the upper triangle of 4 tokens is masked
    assert lesson_drawing(sections["compare"]) is None
    out = io.StringIO()
    show_lesson([sections["borrow"]], out)
    assert out.getvalue().startswith("1. Borrow") and "how much of each value" in out.getvalue()


def test_explain_drawing_shows_the_detail_head():
    toks = ["[CLS]", "the", "cat", "sat", "because", "it", "was", "tired", "[SEP]"]
    att = fake_capture(toks, n_layers=2, n_heads=3, causal=False)
    report = explain_token(att, "it", layer=1, head=2, special={"[CLS]", "[SEP]"})
    text = to_text(explain_drawing(report, att))
    assert 'what "it" borrows in layer 1, head 2' in text
    best = int(np.argmax(att.weights[1, 2, 5]))
    assert f"{100 * att.weights[1, 2, 5, best]:5.1f}%" in text
    assert "layer 1, head 2: every token" in text
    assert max(len(line) for line in text.splitlines()) <= 80


@pytest.mark.parametrize("n", [30])
def test_explain_drawing_long_text_is_summarised(n):
    toks = [f"w{i}" for i in range(n)]
    att = fake_capture(toks, n_layers=1, n_heads=1, causal=False)
    report = explain_token(att, 3, layer=0, head=0)
    text = to_text(explain_drawing(report, att))
    assert f"more tokens not shown (top 12 of {n}" in text


def test_explain_cli_adds_the_drawing_only_in_a_terminal(monkeypatch, capsys):
    import json
    from types import SimpleNamespace

    toks = ["the", "cat", "sat", "because", "it", "was", "tired"]
    att = fake_capture(toks, n_layers=2, n_heads=2, causal=False)
    monkeypatch.setattr("attnlab.explain.model.load_model",
                        lambda path=None: SimpleNamespace(special_tokens=frozenset()))
    monkeypatch.setattr("attnlab.explain.model.run_model", lambda text, model=None: att)
    args = ["explain", " ".join(toks), "--token", "it", "--layer", "1", "--head", "0"]
    assert main(args) == 0
    piped = capsys.readouterr().out
    assert "borrows in layer" not in piped
    monkeypatch.setattr("attnlab.viz.terminal.wanted", lambda plain=False, stream=None: not plain)
    assert main(args) == 0
    drawn = capsys.readouterr().out
    assert drawn.startswith(piped) and 'what "it" borrows in layer 1, head 0' in drawn
    assert main([*args, "--plain"]) == 0
    assert capsys.readouterr().out == piped
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["detail"]["layer"] == 1
