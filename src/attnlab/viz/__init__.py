"""Drawing what explain computes.

- `terminal` / `terminal_reports`: rich bars and heatmaps for `attnlab explain` and `lesson`
  (`lesson_text`: the lesson as plain text);
- `figures`: matplotlib PNG/SVG of one head, a layer's heads, or the whole model (`attnlab plot`);
- `page`: one self-contained, offline HTML page with head, model and step views (`attnlab view`);
- `app`: the local web app serving the same page (`attnlab serve`);
- `notebook`: the `_repr_html_` of Trace and ModelAttention.

Each module imports its optional dependency (rich, matplotlib) inside the functions that need it.
"""

import importlib as _importlib

_LAZY = {"plot": "figures", "save_plot": "figures", "page_html": "page", "write_page": "page"}
__all__ = ["page_html", "plot", "save_plot", "write_page"]


def __getattr__(name: str):  # imported on first use: `attnlab.viz.x` stays cheap to import
    if name not in _LAZY:
        raise AttributeError(f"module 'attnlab.viz' has no attribute {name!r}")
    return getattr(_importlib.import_module(f"attnlab.viz.{_LAZY[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
