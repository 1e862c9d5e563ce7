"""docs/develop.md stays true: its first example is the walk-through that adds an interval-shaped
mask kind, and its code runs as written and does what the page says (the kind is interval-shaped,
"auto" runs it on the interval kernel); every file and test the page points to exists."""

from __future__ import annotations

import re

from attnlab.masks.band import Band
from attnlab.ops import kernels
from docs.doc_blocks import ROOT, python_blocks

PAGE = ROOT / "docs" / "develop.md"
#: files the walk-through tells the reader to create
NEW = {"src/attnlab/masks/chunked.py", "tests/masks/test_chunked.py", "masks/<kind>.py",
       "ops/<name>.py", "distributed/<name>.py", "explain/<name>.py", "viz/<name>.py",
       "cli/<command>.py"}


def test_the_walk_through_is_the_first_example_and_runs():
    blocks = python_blocks(PAGE)
    assert "class ChunkedCausal(Band)" in blocks[0].code
    ns = {"__name__": "__main__"}
    for b in blocks:
        assert b.mark is None, f"develop.md:{b.line} must run"
        exec(compile(b.code, f"{PAGE}:{b.line}", "exec"), ns)
    m = ns["chunked_causal"](16)
    assert isinstance(m, Band) and m.intervals(40, 40) is not None
    if kernels.available():
        assert ns["choice"].backend == "interval"


def test_every_path_the_page_names_exists():
    text = PAGE.read_text()
    named = {p for p in re.findall(r"`([\w/<>.-]+\.(?:py|md|h))`", text) if "/" in p}
    assert len(named) > 25
    missing = []
    for path in sorted(named - NEW):
        candidates = [ROOT / path, ROOT / "src" / path, ROOT / "src" / "attnlab" / path,
                      ROOT / "src" / "attnlab" / "ops" / "kernels" / path]
        if not any(c.exists() for c in candidates):
            missing.append(path)
    assert not missing, f"develop.md names files that do not exist: {missing}"
