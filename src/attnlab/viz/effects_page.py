"""The effects page: one offline HTML file with a layer × head grid coloured by each head's effect
next to the grid coloured by where the token looks, a clicked head's steps (compare, scale, mask,
normalize for the token's row) and effect, and the logit lens of a causal model.

Built like the other pages (`attnlab.viz.html_doc`): inline script allowed by its hash, no
request possible, text set through textContent; `window.attnlabEffects` holds the page's state
(`select(layer, head)`).
"""

from __future__ import annotations

from pathlib import Path

from attnlab.explain.effects import HeadEffects, effects_payload
from attnlab.viz.effects_text import CAVEAT
from attnlab.viz.html_doc import asset, document


def effects_html(fx: HeadEffects) -> str:
    data = {**effects_payload(fx), "caveat": CAVEAT}
    what = "patching" if fx.kind == "patch" else "ablation"
    return document(title=f"attnlab {what}: {fx.texts[-1]}"[:120], css=asset("effects.css"),
                    js=asset("effects.js"), body=asset("effects.html"),
                    data=("effects-data", data))


def write_effects_page(fx: HeadEffects, path) -> Path:
    """Write the effects page of `fx` to `path` (UTF-8); returns the path."""
    path = Path(path)
    path.write_text(effects_html(fx), encoding="utf-8")
    return path


def effects_view(fx: HeadEffects, height: int = 900):
    """The effects page for Jupyter (a sandboxed iframe; `.save(path)` writes the file)."""
    from attnlab.viz.iframe import NotebookPage

    return NotebookPage(effects_html(fx), height)
