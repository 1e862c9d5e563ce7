"""The docs' real pages and the pictures taken of them, made while the site builds (so neither can
go stale): the explorable lesson page and a view page of all-MiniLM-L6-v2 (the README's sentence,
opened on "it"), and PNGs of both drawn by headless Chromium (Debian's, as the browser tests use).

    python docs/hooks/pictures.py            # the same by hand: pages into build/pages, PNGs into
                                             # docs/img (or: PAGES_DIR IMG_DIR)

`generate.py` (the MkDocs hook) calls `write_pages` for the site and `take_pictures` for docs/img.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-gpu",
        "--disable-component-update", "--no-first-run", "--disable-sync"]
TEXT = "The cat sat on the mat because it was tired."
#: the explorable page's sections and the picture of each
LESSON_SHOTS = {"compare": "lesson-compare.png", "normalize": "lesson-normalise.png",
                "scale": "lesson-scale.png", "borrow": "lesson-borrow.png",
                "mask": "lesson-mask.png", "heads": "lesson-heads.png",
                "check": "lesson-check.png"}


def write_pages(dest: Path) -> dict[str, Path]:
    """lesson.html and view.html into `dest`; returns {name: path}."""
    import torch

    from attnlab.cli import main

    torch.set_num_threads(1)
    dest.mkdir(parents=True, exist_ok=True)
    lesson, view = dest / "lesson.html", dest / "view.html"
    from attnlab.viz.lesson_page import write_lesson_page

    write_lesson_page(lesson)
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        if main(["view", TEXT, "--token", "it", "-o", str(view)]) != 0:
            raise RuntimeError("attnlab view failed while building the docs")
    return {"lesson": lesson, "view": view}


def take_pictures(pages: dict[str, Path], img: Path) -> list[Path]:
    """PNGs of the pages as they open (view.png: the head view, step.png: the step view with the
    layer walk; one per explorable section) into `img`; returns the files written."""
    if not os.access(CHROMIUM, os.X_OK):
        raise RuntimeError(f"{CHROMIUM} is missing: the docs' pictures are taken with Debian's "
                           "chromium; run `make chromium` as root (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    img.mkdir(parents=True, exist_ok=True)
    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            ctx = browser.new_context(viewport={"width": 1100, "height": 800},
                                      device_scale_factor=1)
            ctx.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:")
                      else r.abort())
            page = ctx.new_page()
            page.goto(pages["view"].as_uri())
            page.wait_for_selector("#drawing .link", state="attached")
            out.append(_shot(page, "body", img / "view.png"))
            page.click(".tab[data-view=step]")
            out.append(_shot(page, "#drawing", img / "step.png"))
            page.goto(pages["lesson"].as_uri())
            page.wait_for_selector("body[data-ready='1']", state="attached")
            for section, name in LESSON_SHOTS.items():
                out.append(_shot(page, f"section#{section}", img / name))
        finally:
            browser.close()
    return out


def _shot(page, selector: str, path: Path) -> Path:
    page.locator(selector).first.screenshot(path=str(path))
    return path


if __name__ == "__main__":  # python docs/hooks/pictures.py [PAGES_DIR IMG_DIR]
    sys.path.insert(0, str(ROOT / "src"))
    pages_dir, img_dir = (Path(a) for a in (sys.argv[1:3] if len(sys.argv) == 3 else
                                            (ROOT / "build" / "pages", ROOT / "docs" / "img")))
    made = write_pages(pages_dir)
    for f in take_pictures(made, img_dir):
        print(f"wrote {f}")
