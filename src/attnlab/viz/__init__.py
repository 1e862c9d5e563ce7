"""Drawing what explain computes.

- `terminal` / `terminal_reports`: rich bars and heatmaps for `attnlab explain` and `lesson`
  (`lesson_text`: the lesson as plain text);
- `figures`: matplotlib PNG/SVG of one head, a layer's heads, or the whole model (`attnlab plot`);
- `page`: one self-contained, offline HTML page with head, model and step views (`attnlab view`);
- `app`: the local web app serving the same page (`attnlab serve`);
- `notebook`: the `_repr_html_` of Trace and ModelAttention;
- `head_view` / `model_view` / `save`: bertviz's calls on any model's attentions (they live in
  `attnlab.notebook_views`, which builds the ModelAttention that viz draws).

Each module imports its optional dependency (rich, matplotlib) inside the functions that need it.
"""

import importlib as _importlib

_LAZY = {"plot": "figures", "save_plot": "figures", "page_html": "page", "write_page": "page",
         "head_view": "attnlab.notebook_views", "model_view": "attnlab.notebook_views",
         "save": "attnlab.notebook_views"}
__all__ = ["head_view", "model_view", "page_html", "plot", "save", "save_plot", "write_page"]


def __getattr__(name: str):  # imported on first use: `attnlab.viz.x` stays cheap to import
    if name not in _LAZY:
        raise AttributeError(f"module 'attnlab.viz' has no attribute {name!r}")
    module = _LAZY[name] if "." in _LAZY[name] else f"attnlab.viz.{_LAZY[name]}"
    return getattr(_importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
