"""Attention weights in the terminal with rich: bars for one token, a heatmap for one head.

Everything fits 80 columns. Each cell carries a shade character as well as a colour, so the picture
survives without colour (pipes, `NO_COLOR`, dumb terminals). Long inputs degrade with a notice:
bars keep the top-k keys, the heatmap keeps the first tokens that fit.
"""

from __future__ import annotations

import io

import numpy as np

from attnlab.errors import AttnlabError

SHADES = " ░▒▓█"
WIDTH = 80
LABEL = 12  # columns for a token label


def _rich():
    try:
        import rich  # noqa: F401
    except ImportError:  # pragma: no cover - the term/viz extras bring it
        raise AttnlabError("terminal drawing needs rich: pip install 'attnlab[term]'") from None
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    return Group, Table, Text


def color(w: float) -> str:
    """White-blue ramp for weight w in [0, 1] (the figures' "Blues", roughly)."""
    w = float(np.clip(w, 0.0, 1.0))
    r, g, b = (round(a + (z - a) * w) for a, z in ((222, 8), (235, 48), (247, 107)))
    return f"#{r:02x}{g:02x}{b:02x}"


def shade(w: float) -> str:
    return SHADES[round(float(np.clip(w, 0.0, 1.0)) * (len(SHADES) - 1))]


def label(tok: str, n: int = LABEL) -> str:
    tok = str(tok).replace("\n", "\\n").replace("\t", "\\t")
    return tok if len(tok) <= n else tok[: n - 1] + "…"


def bars(weights, tokens, *, allowed=None, top_k: int | None = None, width: int = WIDTH,
         title: str | None = None):
    """One query's weights over its keys as bars, in token order; with more than `top_k` allowed
    keys only the top-k are kept (ordered by weight) and a notice says what was left out."""
    Group, Table, Text = _rich()
    w = np.asarray(weights, dtype=float)
    ok = np.ones(w.shape, dtype=bool) if allowed is None else np.asarray(allowed, dtype=bool)
    order = [j for j in range(len(w)) if ok[j]]
    notice = None
    if top_k is not None and len(order) > top_k:
        order = sorted(order, key=lambda j: -w[j])[:top_k]
        rest = float(w[ok].sum() - w[order].sum())
        notice = (f"… {int(ok.sum()) - top_k} more tokens not shown (top {top_k} of "
                  f"{int(ok.sum())}; together {100 * rest:.1f}%)")
    bar_w = max(10, min(width, WIDTH) - LABEL - 14)
    table = Table(title=title, show_header=False, box=None, pad_edge=False, padding=(0, 1))
    table.add_column("token", width=LABEL, no_wrap=True)
    table.add_column("bar", width=bar_w, no_wrap=True)
    table.add_column("weight", justify="right", width=6, no_wrap=True)
    for j in order:
        n = round(w[j] * bar_w)
        table.add_row(Text(label(tokens[j])), Text("█" * n or "▏", style=color(max(w[j], 0.35))),
                      f"{100 * w[j]:5.1f}%")
    masked = int((~ok).sum())
    parts = [table]
    if masked:
        parts.append(Text(f"({masked} masked tokens not shown: this token may not look at them)",
                          style="dim"))
    if notice:
        parts.append(Text(notice, style="dim"))
    return Group(*parts)


def heatmap(weights, row_tokens, col_tokens, *, mask=None, width: int = WIDTH,
            title: str | None = None, max_rows: int = 40):
    """One head's (L, S) weights as shaded cells, two characters each; masked cells are a dim "·".
    Keeps the first tokens that fit `width` (and `max_rows` rows) and says so."""
    Group, _, Text = _rich()
    w = np.asarray(weights, dtype=float)
    L, S = w.shape
    ok = np.ones(w.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    cols = max(1, min(S, (min(width, WIDTH) - LABEL - 2) // 2))
    rows = min(L, max_rows)
    lines = []
    if title:
        lines.append(Text(title, style="bold"))
    # column header: key indices, ones digit (tens digit above it when there are >= 10)
    if cols > 10:
        lines.append(Text(" " * (LABEL + 1) + "".join(f"{j // 10 % 10 if j >= 10 else ' '} "
                                                       for j in range(cols))))
    lines.append(Text(" " * (LABEL + 1) + "".join(f"{j % 10} " for j in range(cols))))
    for i in range(rows):
        line = Text(f"{label(row_tokens[i], LABEL - 1):>{LABEL}} ")
        for j in range(cols):
            if ok[i, j]:
                # colour fills the cell; the shade character carries it when colour is off
                line.append(shade(w[i, j]) * 2, style=f"{color(w[i, j])} on {color(w[i, j])}")
            else:
                line.append("· ", style="dim")
        lines.append(line)
    keys = ", ".join(f"{j} {label(col_tokens[j], 10)}" for j in range(cols))
    lines.append(Text(f"keys: {keys}", style="dim"))
    lines.append(Text(f"rows: query tokens; shade = weight {SHADES[1]}{SHADES[2]}{SHADES[3]}"
                      f"{SHADES[4]} (0→100%), · = masked", style="dim"))
    if cols < S or rows < L:
        lines.append(Text(f"showing the first {rows} of {L} query tokens and {cols} of {S} key "
                          f"tokens to fit {min(width, WIDTH)} columns; `attnlab plot` or "
                          f"`attnlab view` draws them all", style="yellow"))
    return Group(*lines)


def to_text(renderable, *, width: int = WIDTH, color: bool = False) -> str:
    """Render to a string: ANSI colours when `color`, plain characters otherwise."""
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, no_color=not color,
                      color_system="truecolor" if color else None, highlight=False,
                      soft_wrap=False, emoji=False)
    console.print(renderable)
    return buf.getvalue()


def wanted(plain: bool = False, stream=None) -> bool:
    """Draw with rich? Not with --plain, not into a pipe or file, not on a dumb terminal, and
    only when rich is installed; the plain text is always printed either way."""
    import os
    import sys

    stream = sys.stdout if stream is None else stream
    if plain or not getattr(stream, "isatty", lambda: False)() or os.environ.get("TERM") == "dumb":
        return False
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def show(renderable, stream=None) -> None:
    """Print a drawing to a terminal (colour as the terminal allows), at most 80 columns wide."""
    import sys

    from rich.console import Console

    console = Console(file=sys.stdout if stream is None else stream, highlight=False,
                      soft_wrap=False, emoji=False)
    console.width = min(console.width, WIDTH)
    console.print(renderable)
