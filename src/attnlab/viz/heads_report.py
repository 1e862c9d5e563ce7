"""`attnlab heads` as text: by default a short report (the top heads, each label in words, and
the focused heads no label names, with why); `full=True` one row per head with every statistic
and its label, best first (`HeadStats.ranked`); or the same as CSV."""

from __future__ import annotations

import csv
import io
import math
import textwrap

from attnlab.explain.head_statistics import STATS, HeadStats, rules_text
from attnlab.explain.head_words import focused_unlabelled, head_words

#: the short report's heads by default
SHORT_TOP = 8

#: column titles (6 characters a column: the table is 101 columns wide)
_SHORT = {"entropy": "ent", "entropy_norm": "entN", "self": "self", "prev": "prev",
          "next": "next", "first": "first", "special": "spec", "punct": "punct", "max": "max",
          "offset": "off", "offset_share": "offS", "duplicate": "dup", "induction": "ind"}


def _cell(name: str, v: float) -> str:
    if math.isnan(v):
        return f"{'-':>6}"
    if name == "offset":
        return f"{int(v):>+6d}"
    return f"{v:6.2f}"


def _counts(stats: HeadStats) -> str:
    counts: dict[str, int] = {}
    for row in stats.labels:
        for label in row:
            counts[label] = counts.get(label, 0) + 1
    named = sorted(((n, lab) for lab, n in counts.items() if lab != "-"), reverse=True)
    parts = [f"{n} {lab}" for n, lab in named]
    return ", ".join(parts) + (f"; {counts['-']} without a label" if "-" in counts else "")


def _wrapped(head: str, words: str) -> list[str]:
    return textwrap.wrap(words, 100, initial_indent=f"  {head:<8}", subsequent_indent=" " * 10)


def render_heads(stats: HeadStats, *, sort: str = "max", top: int | None = None,
                 probe: str | None = None, full: bool = False) -> str:
    """The short report (`full=False`: the first `top` heads by `sort`, default SHORT_TOP, and
    the focused heads without a label, each in words), or the heads table (`full=True`: one row
    per head, the first `top` by `sort`, every statistic, the label rules)."""
    if not full:
        return _short(stats, sort=sort, top=top or SHORT_TOP, probe=probe)
    pairs = stats.ranked(sort)
    shown = pairs if top is None else pairs[:top]
    texts = "1 text" if stats.texts == 1 else f"{stats.texts} texts"
    out = [f"{stats.model}: {stats.n_layers} layers x {stats.n_heads} heads, statistics over "
           f"{texts}; sorted by {sort}"]
    if probe:
        out.append(probe)
    out.append(f"{'head':<8}{'label':<15}" + "".join(f"{_SHORT[n]:>6}" for n in STATS))
    for l, h in shown:
        row = f"L{l} H{h:<5}"[:8].ljust(8) + f"{stats.labels[l][h]:<15}"
        out.append(row + "".join(_cell(n, float(stats[n][l, h])) for n in STATS))
    if len(shown) < len(pairs):
        out.append(f"... {len(pairs) - len(shown)} more heads (--top K to show more)")
    out += ["", *textwrap.wrap("columns: " + ", ".join(f"{_SHORT[n]} = {n}" for n in STATS),
                               100),
            *textwrap.wrap("labels: " + rules_text(), 100)]
    return "\n".join(out) + "\n"


def _short(stats: HeadStats, *, sort: str, top: int, probe: str | None) -> str:
    texts = "1 text" if stats.texts == 1 else f"{stats.texts} texts"
    out = textwrap.wrap(f"{stats.model}: {stats.n_layers} layers x {stats.n_heads} heads over "
                        f"{texts}; labels: {_counts(stats)}", 100)
    if probe:
        out.append(probe)
    what = ("mean largest weight: how hard a head looks at one token" if sort == "max"
            else sort)
    out += ["", *textwrap.wrap(f"The {top} heads highest on {what}, each in words:", 100)]
    shown = stats.ranked(sort)[:top]
    for l, h in shown:
        label = stats.labels[l][h]
        out += _wrapped(f"L{l} H{h}", (f"{label}: " if label != "-" else "") +
                        head_words(stats, l, h))
    rest = [p for p in focused_unlabelled(stats) if p not in shown]
    if rest:
        out += ["", "Focused heads no label names (a label is a habit of position; these choose "
                "by content):"]
        for l, h in rest:
            out += _wrapped(f"L{l} H{h}", head_words(stats, l, h))
    out += ["", *textwrap.wrap("Every head with its 13 statistics: --all (with --top K, the "
                               "first K); as data: --json or --csv; what the heads do with one "
                               "word: attnlab explain TEXT --token WORD.", 100)]
    return "\n".join(out) + "\n"


def heads_csv(stats: HeadStats, *, sort: str = "max", top: int | None = None) -> str:
    """layer,head,label,<every statistic>: one line per head, in the table's order."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["layer", "head", "label", *STATS])
    pairs = stats.ranked(sort)
    for l, h in pairs if top is None else pairs[:top]:
        values = []
        for n in STATS:
            v = float(stats[n][l, h])
            values.append("" if math.isnan(v) else int(v) if n == "offset" else f"{v:.6g}")
        writer.writerow([l, h, stats.labels[l][h], *values])
    return buf.getvalue()
