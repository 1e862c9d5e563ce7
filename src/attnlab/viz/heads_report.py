"""`attnlab heads` as text: one row per head with every statistic and its label, best first
(`HeadStats.ranked`); or the same as CSV."""

from __future__ import annotations

import csv
import io
import math
import textwrap

from attnlab.explain.head_statistics import STATS, HeadStats, rules_text

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


def render_heads(stats: HeadStats, *, sort: str = "max", top: int | None = None,
                 probe: str | None = None) -> str:
    """The heads table: header, one row per head (the first `top` by `sort`), the label rules."""
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
