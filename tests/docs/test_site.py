"""The docs site's generated parts: the CLI reference covers every command and option (it is built
from the parsers, so it cannot drift), command outputs are inserted, and every page is in the
navigation."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import docs_hook

ROOT = Path(__file__).resolve().parents[2]


def _hook():
    return docs_hook("generate")


def test_cli_reference_has_every_command_and_option():
    from attnlab.cli import build_parser

    text = _hook().cli_reference()
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        assert f"## attnlab {name}\n" in text
        for action in p._actions:
            for flag in action.option_strings:
                if action.help != "==SUPPRESS==":
                    assert flag in text, f"attnlab {name} {flag} missing from the reference"


def test_run_markers_insert_the_commands_output():
    page = "Intro\n\n<!-- run: attnlab lesson --section compare --plain -->\n"
    out = _hook().on_page_markdown(page, None, None, None)
    assert "$ attnlab lesson --section compare --plain" in out
    assert "score = 2*3 + 1*1 = 7" in out and "<!--" not in out


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s+(\S+\.(?:md|ipynb))\s*$", nav, flags=re.M))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")
             if "hooks" not in p.parts}
    notebooks = {f"examples/{p.name}" for p in (ROOT / "examples").glob("*.ipynb")}
    assert pages | notebooks == listed
