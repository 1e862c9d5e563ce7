"""No import circle anywhere in the tree: src, tests, benchmarks and docs/hooks, counting every
import (at module level, inside functions, under `if TYPE_CHECKING:`), as DESIGN.md asks.

Each file's imports are read with `ast` (nothing is imported) and resolved to files of the tree
the way Python would find them: `attnlab.*` in src/, a script's siblings in its own folder and
in its root's folder (benchmarks/ scripts import each other by plain name; pytest puts a test
file's folder and tests/ on sys.path). `from a.b import c` counts as importing the module a.b.c
when that is a file, else a.b. An import of a package counts as its __init__.py."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
try:
    from import_graph import sccs  # the one circle finder (tools/import_graph.py)
finally:
    sys.path.pop(0)
AREAS = ("src", "tests", "benchmarks", "docs/hooks")


def _files() -> list[Path]:
    return sorted(p for a in AREAS for p in (ROOT / a).rglob("*.py")
                  if ".venv" not in p.parts and "__pycache__" not in p.parts)


def _lookup(name: str, bases: list[Path]) -> Path | None:
    """The file `name` (dotted) is in the first base that has it."""
    for base in bases:
        path = base.joinpath(*name.split("."))
        for f in (path.with_suffix(".py"), path / "__init__.py"):
            if f.is_file():
                return f
    return None


def _bases(f: Path) -> list[Path]:
    area = next(ROOT / a for a in AREAS if f.is_relative_to(ROOT / a))
    return list(dict.fromkeys([f.parent, area, ROOT / "src"]))


def _package(f: Path) -> Path:
    return f.parent


def imports_of(f: Path) -> set[Path]:
    """The files of the tree that `f` imports, anywhere in it."""
    tree = ast.parse(f.read_text(), filename=str(f))
    bases, found = _bases(f), set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against f's package
                pkg = _package(f)
                for _ in range(node.level - 1):
                    pkg = pkg.parent
                base = [pkg]
                mod = node.module or ""
                for a in node.names:
                    got = _lookup(f"{mod}.{a.name}".strip("."), base) or (
                        _lookup(mod, base) if mod else pkg / "__init__.py")
                    if got is not None and got.is_file():
                        found.add(got)
                continue
            names = [f"{node.module}.{a.name}" if _lookup(f"{node.module}.{a.name}", bases)
                     else node.module for a in node.names]
        for name in names:
            got = _lookup(name, bases)
            if got is not None and got != f:
                found.add(got)
    return found


def test_the_finder_finds_a_circle(tmp_path):
    a, b, c = (tmp_path / f"{n}.py" for n in "abc")
    a.write_text("def f():\n    import b\n")
    b.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from c import x\n")
    c.write_text("import a\n")
    graph = {f: {tmp_path / f"{n}.py" for n in _names(f)} for f in (a, b, c)}
    assert sccs(graph) == [sorted([a, b, c])]
    assert sccs({a: set(), b: {a}, c: {a, b}}) == []


def _names(f: Path) -> list[str]:
    tree = ast.parse(f.read_text())
    return [a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
            for a in n.names] + [n.module for n in ast.walk(tree)
                                 if isinstance(n, ast.ImportFrom) and n.module != "typing"]


def test_benchmark_siblings_resolve():
    f = ROOT / "benchmarks" / "distributed.py"
    assert ROOT / "benchmarks" / "distributed_planning.py" in imports_of(f)
    assert ROOT / "src" / "attnlab" / "ops" / "dispatch.py" in imports_of(
        ROOT / "src" / "attnlab" / "ops" / "api.py")


def test_no_import_circle_anywhere():
    graph = {f: imports_of(f) for f in _files()}
    found = sccs(graph)
    assert not found, "import circles:\n" + "\n".join(
        " -> ".join(str(p.relative_to(ROOT)) for p in comp) for comp in found)
