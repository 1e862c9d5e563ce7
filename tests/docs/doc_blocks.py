"""The fenced code blocks of the README and the docs pages, as the tests run them.

A ```python block runs as written. The line right before a block may say how instead:
`<!-- no-run: REASON -->` (it must not run here; the reason is required) or
`<!-- run-as: COMMAND FILE -->` (the block is the file FILE, run by COMMAND, e.g. torchrun).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
MARK = re.compile(r"<!--\s*(no-run|run-as):\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    page: str  # path relative to the repository
    line: int  # 1-based line of the opening fence
    code: str
    mark: str | None = None  # "no-run" | "run-as"
    arg: str = ""


def pages() -> list[Path]:
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)
    return [ROOT / "README.md", *docs]


def python_blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        if m.group(1) not in ("python", "py"):
            continue
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.search(before)
        out.append(Block(str(path.relative_to(ROOT)), text[:m.start()].count("\n") + 1,
                         m.group(2), mark and mark.group(1), mark.group(2) if mark else ""))
    return out
