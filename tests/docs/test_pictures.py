"""The docs' real pages and their pictures are made by the docs build from the current pages
(docs/hooks/pictures.py): the site's view page opens where the README's picture is, and every
picture the docs show is written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import docs_hook

ROOT = Path(__file__).resolve().parents[2]


def _pictures():
    return docs_hook("pictures")


@pytest.mark.slow
def test_pages_and_pictures_are_made_from_the_current_pages(tmp_path):
    import subprocess
    import sys

    pictures = _pictures()
    # its own process, as in the docs build (a test session may already run Playwright)
    done = subprocess.run([sys.executable, str(ROOT / "docs/hooks/pictures.py"),
                           str(tmp_path / "pages"), str(tmp_path / "img")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    view = (tmp_path / "pages" / "view.html").read_text(encoding="utf-8")
    assert '"opening":{"layer":2,"head":8,"token":8}' in view and '"walk":{' in view
    made = sorted((tmp_path / "img").glob("*.png"))
    names = {p.name for p in made}
    assert names == {"view.png", "step.png", *pictures.LESSON_SHOTS.values()}
    for p in made:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, p
    # every picture of a page that the README and the docs show is one the build makes
    shown = set(re.findall(r"img/([\w-]+\.png)", (ROOT / "README.md").read_text()))
    for md in (ROOT / "docs").rglob("*.md"):
        shown |= set(re.findall(r"img/((?:view|step|lesson-[\w]+)\.png)", md.read_text()))
    assert shown & {"view.png", "step.png"} and shown - {"plot.png"} <= names | {
        "heads-prev.png", "induction-plain.png", "induction-training.png", "train_loss.png"}
