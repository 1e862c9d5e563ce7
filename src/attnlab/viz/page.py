"""One self-contained HTML page: the head, model and step views with their data inlined.

The page fetches nothing: script, style and data are inline and its Content-Security-Policy
(script allowed only by its SHA-256 hash, `connect-src 'none'`) makes the browser refuse any
request, and any script an injected token might smuggle in. The web app serves the same page in
"app" mode, where the only allowed requests go back to the app itself.
"""

from __future__ import annotations

from pathlib import Path

from attnlab.capture import ModelAttention
from attnlab.errors import AttnlabError
from attnlab.viz.html_doc import asset, document, fill, policy
from attnlab.viz.payload import payload

_APP_FORM = """<form id="ask" autocomplete="off">
<input type="text" id="text" aria-label="sentence"
 value="The cat sat on the mat because it was tired.">
<select id="model" aria-label="model"></select>
<button type="submit">Show attention</button>
<span id="status"></span>
</form>
<div id="error" role="alert"></div>
"""


def csp(app: bool = False) -> str:
    """The page's policy: its one script, and no requests (the app's page: its own origin)."""
    return policy(asset("attn.js"), _connect(app))


def _connect(app: bool) -> str:
    return "'self'" if app else "'none'"


THEMES = ("light", "dark")


def page_html(ma: ModelAttention | None = None, text: str | None = None, app: bool = False,
              opening: dict[str, int | str] | None = None, *, data: dict | None = None,
              theme: str = "light", token: str | int | None = None,
              walk: dict | None = None) -> str:
    """The page for one capture (`ma`), for a ready `data` (a `payload` or a `document` of
    several), or the web app's page (`app=True`, data fetched later); `opening` is where it opens,
    as a link's #fragment says it ({"view": "model", "layer": 2}), by default the head `explain`
    ranks first for `token` (default "it" when the text has it), pinned; `theme` "light" or
    "dark"."""
    if theme not in THEMES:
        raise AttnlabError(f'theme: expected "light" or "dark", got {theme!r}')
    if ma is not None:
        data = payload(ma, text, token=token, walk=walk)
    title = ""
    if data is not None:
        title = text or " ".join((data["sets"][0] if "sets" in data else data)["tokens"])
    title = f"attnlab: {title}" if title else "attnlab"
    return document(
        title=title[:120], css=asset("attn.css"), js=asset("attn.js"),
        body=fill(asset("page.html"), {"form": _APP_FORM if app else ""}),
        attrs={"data-mode": "app" if app else "page", "data-theme": theme,
               "data-open": "&".join(f"{k}={v}" for k, v in (opening or {}).items())},
        data=None if data is None else ("attn-data", data), connect=_connect(app))


def write_page(ma: ModelAttention, path, text: str | None = None,
               token: str | int | None = None, walk: dict | None = None) -> Path:
    """Write the self-contained page for `ma` to `path` (UTF-8), opening on `token` (see
    `page_html`), with `walk` (the layer walk of the opening) in its step view; returns the
    path."""
    path = Path(path)
    path.write_text(page_html(ma, text, token=token, walk=walk), encoding="utf-8")
    return path
