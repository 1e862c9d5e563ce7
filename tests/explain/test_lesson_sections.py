"""attnlab lesson: every section the issue lists, with numbers computed (never typed in)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnlab.cli import main
from attnlab.explain import lesson_sections as lesson
from attnlab.explain.lesson_sections import SECTIONS, build_lesson

LISTED = ["compare", "normalize", "scale", "borrow", "mask", "heads", "check"]


def softmax(x):
    e = np.exp(np.asarray(x, float) - np.max(x))
    return e / e.sum()


def by_name():
    return {s.name: s.to_json() for s in build_lesson()}


def test_every_listed_section_in_order():
    assert list(SECTIONS) == LISTED
    assert [s.name for s in build_lesson()] == LISTED


def test_compare_writes_out_each_dot_product():
    s = by_name()["compare"]
    assert [r["arithmetic"] for r in s["rows"]] == ["2*3 + 1*1 = 7", "2*0 + 1*4 = 4",
                                                    "2*1 + 1*1 = 3"]
    assert s["best_match"] == "cat"


def test_softmax_scaled_and_unscaled():
    s = by_name()["scale"]
    np.testing.assert_allclose(s["weights"], softmax([7, 4, 3]), atol=1e-12)
    np.testing.assert_allclose(s["scaled_weights"], softmax(np.array([7, 4, 3]) / np.sqrt(2)),
                               atol=1e-12)
    assert max(s["scaled_weights"]) < max(s["weights"])  # scaling cools softmax down


def test_two_heads_find_different_tokens():
    s = by_name()["heads"]
    x = np.array(s["embeddings"])
    i = s["tokens"].index("it")
    tops = set()
    for h in s["heads"]:
        q, k = x @ np.array(h["w_q"]), x @ np.array(h["w_k"])
        np.testing.assert_allclose(h["scores"], k @ q[i], atol=1e-12)
        np.testing.assert_allclose(h["weights"], softmax(k @ q[i] * s["scale"]), atol=1e-12)
        tops.add(h["top_token"])
    assert tops == {"cat", "mat"}


def test_check_answers_follow_the_numbers(monkeypatch):
    answers = {q["question"]: q for q in by_name()["check"]["questions"]}
    assert len(answers) == 12  # six questions in each lesson
    why = answers["Why does the word it need attention in the cat example?"]
    assert "84.8%" in why["answer"] and why["numbers"]["best_match"] == "cat"
    assert answers["Which pair decides the score: query-key, query-value, or key-value?"][
        "numbers"]["max_change_from_values"] == 0.0
    assert answers["What does causal masking prevent?"]["numbers"]["future_weight"] == 0.0
    # change the lesson's query and the answers change with it: nothing is typed in
    monkeypatch.setattr(lesson, "QUERY", [0.0, 2.0])
    moved = {q["question"]: q for q in build_lesson(["check"])[0].to_json()["questions"]}
    assert moved["Why does the word it need attention in the cat example?"]["numbers"][
        "best_match"] == "mat"


@pytest.mark.parametrize("name", LISTED)
def test_cli_section_text_and_json(name, capsys):
    assert main(["lesson", "--section", name]) == 0
    text = capsys.readouterr().out
    assert text.startswith("1. ") and len(text.splitlines()) > 2
    assert main(["lesson", "--section", name, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in data["sections"]] == [name]


def test_cli_full_lesson(capsys):
    assert main(["lesson"]) == 0
    out = capsys.readouterr().out
    for n in range(1, 8):
        assert f"\n{n}. " in "\n" + out
    assert "head who?" in out and "Q: What is multi-head attention?" in out


def test_the_lessons_numbers():
    """The numbers the lessons (and the README) state, from the computation."""
    s = by_name()
    assert s["normalize"]["scores"] == [5.0, -2.0, 1.0] and s["normalize"]["total"] == 4.0
    assert s["normalize"]["divided"] == [1.25, -0.5, 0.25] and s["normalize"]["has_negative"]
    np.testing.assert_allclose(s["normalize"]["softmax"], softmax([5, -2, 1]), atol=1e-12)
    assert round(s["scale"]["weights"][0], 3) == 0.936
    assert round(s["scale"]["scaled_weights"][0], 3) == 0.848
    b = s["borrow"]
    assert [round(x, 3) for x in b["context"]] == [0.873, 0.127]
    np.testing.assert_allclose(b["context"], sum(np.array(r["contribution"]) for r in b["shares"]),
                               atol=1e-12)
    np.testing.assert_allclose([r["weight"] for r in b["shares"]],
                               s["scale"]["scaled_weights"], atol=1e-12)
    tops = {h["top_token"]: round(h["top_weight"], 3) for h in s["heads"]["heads"]}
    assert tops == {"cat": 0.984, "mat": 0.951}


def test_json_keys_keep_their_order_and_token_sections_follow_their_tokens():
    keys = {name: list(s) for name, s in by_name().items()}
    assert keys["scale"] == ["name", "title", "tokens", "scores", "weights", "sum", "scale",
                             "head_dim", "scaled_scores", "scaled_weights"]
    assert keys["mask"] == ["name", "title", "tokens", "allowed", "sees", "weights"]
    assert keys["heads"] == ["name", "title", "tokens", "features", "embeddings", "query_token",
                             "scale", "heads"]
    assert keys["compare"] == ["name", "title", "query_token", "query", "rows", "best_match"]
    s = by_name()
    for name, lists in (("scale", ["scores", "weights", "scaled_scores", "scaled_weights"]),
                        ("mask", ["allowed", "sees", "weights"]), ("heads", ["embeddings"])):
        assert all(len(s[name][k]) == len(s[name]["tokens"]) for k in lists), name
