"""The explorable lesson page without a browser: its starting numbers are the lesson's, it is one
self-contained file whose CSP allows exactly its script, the CLI writes it, `attnlab serve` serves
it at /lesson, and Jupyter gets it in a sandboxed iframe."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import subprocess
import sys
import threading
import urllib.request

import pytest

from attnlab.cli import main
from attnlab.errors import AttnlabError
from attnlab.explain import lesson_sections as lesson
from attnlab.viz import lesson_page, lesson_view
from attnlab.viz.app import Models, make_server
from attnlab.viz.lesson_page import TRIES, lesson_csp, lesson_data, lesson_html, write_lesson_page
from viz.fakes import FakeModels


def _data(doc: str) -> dict:
    return json.loads(re.search(r'id="lesson-data">(.*?)</script>', doc, re.S).group(1))


def test_starting_numbers_are_the_lessons():
    d = lesson_data()
    assert d["query"] == lesson.QUERY and d["keys"] == lesson.KEYS
    assert d["values"] == lesson.VALUES and d["tokens"] == lesson.KEY_TOKENS
    assert d["negative_scores"] == lesson.NEGATIVE_SCORES
    assert d["grid"]["tokens"] == lesson.CAUSAL_TOKENS
    assert [(h["name"], h["w_q"], h["w_k"]) for h in d["heads"]["heads"]] == \
        [(name, wq, wk) for name, (_, wq, wk) in lesson.HEADS.items()]
    assert d["heads"]["embeddings"] == [lesson.EMBEDDINGS[t] for t in lesson.HEAD_TOKENS]


def test_every_question_can_be_tried_on_the_page():
    questions = lesson_data()["questions"]
    check = lesson.build_lesson(["check"])[0].to_json()["questions"]
    assert [q["question"] for q in questions] == [q["question"] for q in check]
    assert [q["answer"] for q in questions] == [q["answer"] for q in check]
    js = lesson_page.asset("lesson.js")
    for q in questions:
        assert len(q["choices"]) >= 2 and q["try"]
        if q["task"]:  # every task the data names is one the page can check
            assert re.search(rf"\b{q['task']}: function", js), q["task"]
            assert q["task_text"]


def test_a_question_without_a_try_is_refused(monkeypatch):
    first = next(iter(TRIES))
    monkeypatch.delitem(TRIES, first)
    with pytest.raises(AttnlabError, match=r"^check: no way to try the question"):
        lesson_data()


def test_page_is_self_contained_with_a_matching_csp():
    doc = lesson_html()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", doc, re.I)
    assert "<link" not in doc and "@import" not in doc and "url(" not in doc
    assert ".innerHTML" not in doc and "fetch(" not in doc and "XMLHttpRequest" not in doc
    scripts = re.findall(r"<script>(.*?)</script>", doc, re.S)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    policy = html.unescape(
        re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', doc).group(1))
    assert policy == lesson_csp()
    assert f"'sha256-{digest}'" in policy
    assert "connect-src 'none'" in policy and "default-src 'none'" in policy
    assert _data(doc) == lesson_data()


def test_text_in_the_data_cannot_become_markup(monkeypatch):
    evil = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"
    first = next(iter(TRIES))
    monkeypatch.setitem(TRIES, first, {**TRIES[first], "try": evil, "choices": [evil, "b"]})
    doc = lesson_html()
    assert "<img" not in doc and doc.count("<script") == 2
    (q,) = [q for q in _data(doc)["questions"] if q["question"] == first]
    assert q["try"] == evil and q["choices"][0] == evil


def test_cli_writes_the_page(tmp_path, capsys):
    out = tmp_path / "lesson.html"
    assert main(["lesson", "--html", "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == lesson_html()
    assert f"wrote {out}" in capsys.readouterr().out
    assert main(["lesson", "--html"]) == 0
    assert capsys.readouterr().out == lesson_html()


@pytest.mark.parametrize("argv, message", [
    (["lesson", "-o", "x.html"], "-o x.html: only --html writes a file"),
    (["lesson", "--html", "--json"], "--html: the page holds every section"),
    (["lesson", "--html", "--section", "heads"], "drop --section"),
    (["lesson", "--html", "-o", "lesson.txt"], "-o: expected a file ending in .html"),
    (["lesson", "--html", "-o", "/no/such/dir/l.html"], "-o: no such directory"),
])
def test_cli_refuses_what_it_cannot_do(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_write_lesson_page(tmp_path):
    out = write_lesson_page(tmp_path / "l.html")
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_jupyter_gets_a_sandboxed_iframe(tmp_path):
    page = lesson_view(height=700)
    doc = page._repr_html_()
    assert doc.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts"' in doc
    assert "height:700px" in doc and "<script" not in doc  # all of it inside the escaped srcdoc
    inner = html.unescape(re.search(r'srcdoc="([^"]*)"', doc).group(1))
    assert inner == lesson_html()
    assert page.save(tmp_path / "j.html").read_text(encoding="utf-8") == inner
    with pytest.raises(AttnlabError, match=r"^height: expected"):
        lesson_view(height="big")


def test_importing_explain_does_not_load_viz():
    code = ("import sys, attnlab.explain; "
            "print([m for m in sys.modules if m.startswith('attnlab.viz')])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_app_serves_the_lesson_with_its_own_policy():
    fakes = FakeModels()
    server = make_server(Models({"tiny": None}, load=fakes.load, run=fakes.run), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        with urllib.request.urlopen(base + "/lesson", timeout=10) as r:
            body, policy = r.read().decode("utf-8"), r.headers["Content-Security-Policy"]
        assert body == lesson_html() and policy == lesson_csp()
        with urllib.request.urlopen(base + "/", timeout=10) as r:  # the view page keeps its own
            assert r.headers["Content-Security-Policy"] != lesson_csp()
    finally:
        server.shutdown()
        server.server_close()
