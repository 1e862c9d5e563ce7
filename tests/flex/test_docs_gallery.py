"""The gallery table of docs/use/flex.md is what flex_attention does with each case now."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from flex_gallery import gallery_rows

PAGE = Path(__file__).resolve().parents[2] / "docs" / "use" / "flex.md"


def test_the_gallery_table_is_current():
    text = PAGE.read_text(encoding="utf-8")
    table = re.search(r"^\| case \| form \| path \|\n\|---\|---\|---\|\n((?:\|.*\n)+)", text,
                      flags=re.M)
    assert table, "docs/use/flex.md lost its gallery table"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = gallery_rows()
    assert table.group(1).rstrip("\n").split("\n") == want
