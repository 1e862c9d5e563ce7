"""Drawing the records explain computes; nothing here computes what it shows.

- `terminal` / `terminal_reports` / `explain_text` / `lesson_text` / `heads_report`: the terminal
  text, bars and heatmaps of `attnlab explain`, `lesson`, `heads` and `rollout`;
- `figures` / `head_figures`: matplotlib PNG/SVG of one head, a layer's heads, the whole model,
  head statistics and their curves over training (`attnlab plot`);
- `payload` / `page` / `html_doc`: the self-contained, offline HTML page of a `PagePayload`
  (`attnlab view`); `lesson_page`: the explorable lesson page; `app`: the local web app;
- `notebook`: how Jupyter shows a Trace and a ModelAttention (registered in IPython's display
  formatters); `notebook_views`: bertviz's `head_view` / `model_view` / `save` on attnlab's page,
  and `lesson_view`, the explorable lesson in a notebook.

Each module imports its optional dependency (rich, matplotlib, IPython) inside the functions that
need it. The names below load their module on first use: `attnlab --help` builds parsers that read
constants of viz modules, and must not pay for torch through this package.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnlab.viz.figures import plot, save_plot
    from attnlab.viz.notebook_views import head_view, lesson_view, model_view, save
    from attnlab.viz.page import page_html, write_page

__all__ = ["head_view", "lesson_view", "model_view", "page_html", "plot", "save", "save_plot",
           "write_page"]


def __getattr__(name: str):
    if name in ("head_view", "lesson_view", "model_view", "save"):
        from attnlab.viz import notebook_views as module
    elif name in ("plot", "save_plot"):
        from attnlab.viz import figures as module
    elif name in ("page_html", "write_page"):
        from attnlab.viz import page as module
    else:
        raise AttributeError(f"module 'attnlab.viz' has no attribute {name!r}")
    return getattr(module, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
