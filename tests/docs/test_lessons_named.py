"""Wherever "the lesson" is referred to, the two lessons are named by their titles, with what
each teaches: README, the docs' home and lesson page, `attnlab lesson` and the explorable page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnlab.explain.lessons import FIRST, LESSONS, MATH
from attnlab.viz.lesson_page import lesson_html

ROOT = Path(__file__).resolve().parents[2]


def _flat(text: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", "", text).split())


@pytest.mark.parametrize("page", ["README.md", "docs/index.md", "docs/learn/lesson.md"])
def test_pages_name_both_lessons(page):
    text = _flat((ROOT / page).read_text(encoding="utf-8"))
    assert FIRST in text and MATH in text
    assert "the idea without math" in text


def test_the_lesson_command_and_page_name_them(capsys):
    from attnlab.cli import main

    assert main(["lesson", "--plain"]) == 0
    out = _flat(capsys.readouterr().out)
    for title, teaches in LESSONS:
        assert f'"{title}": {teaches}.' in out
    assert out.index(FIRST) < out.index("1. Compare")
    page = _flat(lesson_html())
    assert FIRST in page and MATH in page
