"""How Jupyter shows attnlab's records: a Trace as its weights in a coloured table, a
ModelAttention as the interactive page in a sandboxed iframe. `register()` adds both to IPython's
HTML display formatter (`import attnlab` calls it inside IPython); the records know nothing of it.

Every token goes through html.escape; the iframe runs the page's script without the notebook's
origin (sandbox without allow-same-origin), so the page can neither read nor break the notebook.
"""

from __future__ import annotations

import html

import numpy as np

from attnlab.capture import ModelAttention
from attnlab.tracing import Trace
from attnlab.viz.iframe import ViewPage
from attnlab.viz.page import page_html
from attnlab.viz.terminal import color

MAX_TABLES = 4   # heads shown for a batched trace
MAX_TOKENS = 64  # rows/columns shown per table


def _cell(w: float, ok: bool) -> str:
    if not ok:
        return '<td style="background:#d4d4d4;color:#777" title="masked">·</td>'
    fg = "#fff" if w > 0.55 else "#222"
    return f'<td style="background:{color(w)};color:{fg}">{100 * w:.1f}%</td>'


def _table(w: np.ndarray, ok: np.ndarray, rows: list[str], cols: list[str], caption: str) -> str:
    L, S = min(w.shape[0], MAX_TOKENS), min(w.shape[1], MAX_TOKENS)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols[:S])
    body = "".join(
        f"<tr><th style='text-align:right'>{html.escape(rows[i])}</th>"
        + "".join(_cell(float(w[i, j]), bool(ok[i, j])) for j in range(S)) + "</tr>"
        for i in range(L))
    more = ""
    if w.shape[0] > L or w.shape[1] > S:
        more = f"<p>showing {L} x {S} of {w.shape[0]} x {w.shape[1]}</p>"
    return (f"<table style='border-collapse:collapse;font:12px monospace' border='1'>"
            f"<caption style='text-align:left'>{html.escape(caption)}</caption>"
            f"<tr><th></th>{head}</tr>{body}</table>{more}")


def trace_html(t: Trace) -> str:
    """The trace's weights, query rows x key columns, one table per leading index (first 4)."""
    w = np.asarray(t.weights, dtype=float)
    L, S = w.shape[-2:]
    ok = np.ones(w.shape, dtype=bool) if t.mask is None else \
        np.broadcast_to(np.asarray(t.mask, dtype=bool), w.shape)
    cols = list(t.tokens) if t.tokens is not None else [str(j) for j in range(S)]
    rows = list(t.query_tokens) if t.query_tokens is not None else [str(i) for i in range(L)]
    flat_w, flat_ok = w.reshape(-1, L, S), ok.reshape(-1, L, S)  # (N, L, S)
    index = list(np.ndindex(*w.shape[:-2])) or [()]
    parts = [f"<div><p><b>{html.escape(repr(t))}</b></p>"]
    for n in range(min(len(index), MAX_TABLES)):
        caption = f"weights{list(index[n]) if index[n] else ''}: rows = queries, columns = keys"
        parts.append(_table(flat_w[n], flat_ok[n], rows, cols, caption))
    if len(index) > MAX_TABLES:
        parts.append(f"<p>… {len(index) - MAX_TABLES} more heads not shown</p>")
    return "".join(parts) + "</div>"


def model_html(ma: ModelAttention, height: int = 640) -> str:
    """The self-contained page for `ma` inside a sandboxed iframe (srcdoc, escaped)."""
    return ViewPage(page_html(ma), height)._repr_html_()


def register(formatter=None) -> bool:
    """Show Trace and ModelAttention as HTML: `formatter` is an IPython HTML formatter (default:
    the running shell's). Returns False outside IPython."""
    if formatter is None:
        from IPython import get_ipython  # optional: only a notebook has it

        shell = get_ipython()
        if shell is None:
            return False
        formatter = shell.display_formatter.formatters["text/html"]
    formatter.for_type(Trace, trace_html)
    formatter.for_type(ModelAttention, model_html)
    return True
