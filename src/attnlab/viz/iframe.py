"""A whole attnlab page for Jupyter: `NotebookPage`, what the notebook views and the lesson return.

`.data` is the page's HTML (self-contained, offline, with its own Content-Security-Policy);
`.save(path)` writes it; Jupyter shows it through `_repr_html_`, `iframe_html`: the page escaped
into an iframe's srcdoc, sandboxed with allow-scripts and without allow-same-origin, so the page
runs its script but can neither read nor break the notebook. The view pages also get
allow-downloads, for their PNG / SVG export.
"""

from __future__ import annotations

import html
from pathlib import Path


def iframe_html(page: str, height: int, title: str, *, downloads: bool = False) -> str:
    """`page` (a whole HTML document) in a sandboxed iframe `height` pixels tall."""
    sandbox = "allow-scripts allow-downloads" if downloads else "allow-scripts"
    return (f'<iframe srcdoc="{html.escape(page, quote=True)}" sandbox="{sandbox}" '
            f'style="width:100%;height:{int(height)}px;border:1px solid #ddd" '
            f'title="{html.escape(title, quote=True)}"></iframe>')


class NotebookPage:
    """A page for Jupyter: `.data` is its HTML, `.height` the iframe's pixels, `.save(path)`."""

    title = "attnlab"
    downloads = False

    def __init__(self, data: str, height: int):
        self.data = data
        self.height = int(height)

    def save(self, path) -> Path:
        """Write the page to `path` (UTF-8); returns the path."""
        path = Path(path)
        path.write_text(self.data, encoding="utf-8")
        return path

    def _repr_html_(self) -> str:
        return iframe_html(self.data, self.height, self.title, downloads=self.downloads)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({len(self.data)} characters; display it in Jupyter or "
                ".save(path))")


class ViewPage(NotebookPage):
    """The view page (head, model, step and heads views) for Jupyter."""

    title = "attnlab: attention"
    downloads = True
