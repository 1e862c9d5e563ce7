"""The docs' search works from a file:// copy with no network: a small site built with the docs'
own theme, plugins and polyfill, opened from disk, finds a word (every request that leaves the
folder is refused)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.mktemp("site")
    docs = base / "docs"
    (docs / "javascripts").mkdir(parents=True)
    (docs / "javascripts" / "iframe-worker-shim.js").write_bytes(
        (ROOT / "docs/javascripts/iframe-worker-shim.js").read_bytes())
    (docs / "index.md").write_text("# Home\n\nAttention compares, scales, masks.\n")
    (docs / "borrow.md").write_text("# Borrow\n\nThe weighted sum of values: zanzibar.\n")
    ours = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nhooks:")[0])
    config = {"site_name": "t", "docs_dir": "docs", "site_dir": "site", "theme": ours["theme"],
              "extra": yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["extra"],
              "plugins": ["search", "offline"], "nav": ["index.md", "borrow.md"]}
    (base / "mkdocs.yml").write_text(yaml.safe_dump(config))
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet"], cwd=base,
                   check=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    html = (base / "site/index.html").read_text(encoding="utf-8")
    assert "unpkg.com" not in html and "iframe-worker-shim.js" in html
    return base / "site"


@pytest.mark.slow
def test_search_finds_a_word_from_disk(open_page, site):
    url = (site / "index.html").as_uri()
    page, watch = open_page(url, allowed=["file://"])
    box = page.locator("input[data-md-component='search-query']")
    box.click()
    box.type("zanzibar")
    hit = page.wait_for_selector(".md-search-result__item a", timeout=15000)
    assert hit.get_attribute("href").endswith("borrow.html")
    assert [u for u in watch.requests if not u.startswith("file://")] == []
    assert watch.errors == []
