"""The import graph of src/attnlab: circles, arrows against the layer order, largest files.

    python tools/import_graph.py [SRC]            # SRC defaults to src/attnlab

Layers, lowest first (a module may import only its own layer or lower ones):
errors, formats < reference, masks, ops < distributed < tracing, capture < nn
< models, adapters, bench < explain < viz < cli.
Imports inside a function run on use ("lazy"), and those under `if TYPE_CHECKING:` only for the
type checker; both count as edges (they are listed as lazy / type-only), and a circle is reported
both for import-time edges alone and with the lazy and type-only ones added. Importing a.b.c runs
the package a.b's __init__ first, so that counts as an edge too when a.b lies in another area
(the root package `attnlab` aside: it is the facade over all of them).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

LAYERS = [
    ("errors", "formats"),
    ("reference", "masks", "ops"),
    ("distributed",),
    ("tracing", "capture"),
    ("nn",),
    ("models", "adapters", "bench"),
    ("explain",),
    ("viz",),
    ("cli", "__main__"),
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def modules(src: Path) -> dict[str, Path]:
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id.endswith("TYPE_CHECKING")) or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(name: str, path: Path, known: set[str]):
    """(target, kind) for every attnlab module `name` imports; kind is "" (at import time),
    "lazy" (inside a function) or "type-only" (under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def visit(node, lazy: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for part in child.body:
                    visit(ast.Module(body=[part], type_ignores=[]), lazy or "type-only")
                continue
            inner = lazy or ("lazy" if isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else "")
            if isinstance(child, ast.Import):
                found.extend((a.name, lazy) for a in child.names if a.name.startswith("attnlab"))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1]
                                    + ([base] if base else []))
                if not base.startswith("attnlab"):
                    continue
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    found.append((sub if sub in known else base, lazy))
            visit(child, inner)

    visit(tree, "")
    return [(t, lazy) for t, lazy in found if t != name]


def area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "attnlab"


def sccs(graph: dict) -> list[list]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative:
    no recursion limit, whatever the graph's depth); edges to nodes outside the graph are
    ignored. tests/test_import_graph.py runs it over the whole tree."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def main(src: Path) -> None:
    mods = modules(src)
    known = set(mods)
    eager, lazy, direct, kinds = defaultdict(set), defaultdict(set), set(), {}
    for name, path in mods.items():
        eager[name]
        lazy[name]
        for target, is_lazy in imports(name, path, known):
            (lazy if is_lazy else eager)[name].add(target)
            direct.add((name, target))
            kinds.setdefault((name, target), is_lazy)
            # importing a.b.c runs a.b's __init__ first: an edge when a.b is another area
            parts = target.split(".")
            for i in range(2, len(parts)):
                parent = ".".join(parts[:i])
                if parent in known and area(parent) != area(name):
                    (lazy if is_lazy else eager)[name].add(parent)
    both = {v: eager[v] | lazy[v] for v in mods}
    print(f"modules: {len(mods)}")
    for label, g in (("import-time", eager), ("import-time + lazy + type-only", both)):
        comps = sccs(g)
        print(f"\ncircles between modules ({label} edges): {len(comps)}")
        for comp in comps:
            print("  " + " <-> ".join(comp))
    areas = defaultdict(set)
    for v in mods:
        areas[area(v)]
        for w in both[v]:
            if area(v) != area(w):
                areas[area(v)].add(area(w))
    comps = sccs(areas)
    print(f"\ncircles between areas (import-time + lazy + type-only edges): {len(comps)}")
    for comp in comps:
        print("  " + " <-> ".join(comp))
    print("\narrows against the layer order (importer -> imported):")
    n = 0
    for v in sorted(mods):
        for w, kind in sorted([(w, "") for w in eager[v]]
                              + [(w, f" ({kinds.get((v, w)) or 'lazy'})") for w in lazy[v]]):
            a, b = area(v), area(w)
            if (v, w) in direct and a in RANK and b in RANK and RANK[b] > RANK[a]:
                print(f"  {v} -> {w}{kind}")
                n += 1
    print(f"  total: {n}")
    print("\narea -> areas it imports (import-time, lazy or type-only):")
    for a in sorted(areas, key=lambda a: (RANK.get(a, -1), a)):
        print(f"  {a:<12} -> {', '.join(sorted(areas[a], key=lambda b: (RANK.get(b, -1), b)))}")
    sizes = sorted(((len(p.read_text(encoding='utf-8').splitlines()), n) for n, p in mods.items()),
                   reverse=True)
    print("\nlargest files (lines): " + ", ".join(f"{n} {lines}" for lines, n in sizes[:6]))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "src/attnlab"))
