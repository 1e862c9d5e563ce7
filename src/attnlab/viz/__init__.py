"""Drawing what explain computes.

- `terminal` / `terminal_reports`: rich bars and heatmaps for `attnlab explain` and `lesson`
  (`lesson_text`: the lesson as plain text);
- `figures`: matplotlib PNG/SVG of one head, a layer's heads, or the whole model (`attnlab plot`);
- `page`: one self-contained, offline HTML page with head, model and step views (`attnlab view`);
- `app`: the local web app serving the same page (`attnlab serve`);
- `notebook`: the `_repr_html_` of Trace and ModelAttention.

Each module imports its optional dependency (rich, matplotlib) inside the functions that need it.
"""

from attnlab.viz.figures import plot, save_plot
from attnlab.viz.page import page_html, write_page

__all__ = ["page_html", "plot", "save_plot", "write_page"]
