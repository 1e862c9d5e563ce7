"""One self-contained HTML page: the head, model and step views with their data inlined.

The page fetches nothing: script, style and data are inline and its Content-Security-Policy
(script allowed only by its SHA-256 hash, `connect-src 'none'`) makes the browser refuse any
request, and any script an injected token might smuggle in. The web app serves the same page in
"app" mode, where the only allowed requests go back to the app itself.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.errors import AttnlabError
from attnlab.viz.payload import payload

if TYPE_CHECKING:  # the type only: viz imports no capture module at run time
    from attnlab.capture import ModelAttention

_APP_FORM = """<form id="ask" autocomplete="off">
<input type="text" id="text" aria-label="sentence"
 value="The cat sat on the mat because it was tired.">
<select id="model" aria-label="model"></select>
<button type="submit">Show attention</button>
<span id="status"></span>
</form>
<div id="error" role="alert"></div>
"""


@cache
def asset(name: str) -> str:
    return resources.files("attnlab.viz").joinpath("assets", name).read_text(encoding="utf-8")


def script_hash() -> str:
    """The CSP source that allows exactly our inline script."""
    digest = hashlib.sha256(asset("attn.js").encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def csp(app: bool = False) -> str:
    connect = "'self'" if app else "'none'"
    return (f"default-src 'none'; script-src {script_hash()}; style-src 'unsafe-inline'; "
            f"img-src data: blob:; connect-src {connect}; base-uri 'none'; form-action 'none'")


def json_for_script(obj) -> str:
    """JSON safe inside <script>: no `</script>`, `<!--` or `&` can end or confuse the block."""
    s = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _fill(template: str, parts: dict[str, str]) -> str:
    # one pass, so text inside a part (a token "{js}") is never substituted again
    return re.sub(r"\{(\w+)\}", lambda m: parts[m.group(1)], template)


THEMES = ("light", "dark")


def page_html(ma: ModelAttention | None = None, text: str | None = None, app: bool = False,
              opening: dict[str, int | str] | None = None, *, data: dict | None = None,
              theme: str = "light") -> str:
    """The page for one capture (`ma`), for a ready `data` (a `payload` or a `document` of
    several), or the web app's page (`app=True`, data fetched later); `opening` is where it opens,
    as a link's #fragment says it ({"view": "model", "layer": 2}); `theme` "light" or "dark"."""
    if theme not in THEMES:
        raise AttnlabError(f'theme: expected "light" or "dark", got {theme!r}')
    if ma is not None:
        data = payload(ma, text)
    script = title = ""
    if data is not None:
        script = (f'<script type="application/json" id="attn-data">'
                  f"{json_for_script(data)}</script>\n")
        title = text or " ".join((data["sets"][0] if "sets" in data else data)["tokens"])
    title = f"attnlab: {title}" if title else "attnlab"
    return _fill(asset("page.html"), {
        "csp": html.escape(csp(app)), "title": html.escape(title[:120]), "css": asset("attn.css"),
        "mode": "app" if app else "page", "form": _APP_FORM if app else "", "data": script,
        "theme": theme,
        "js": asset("attn.js"),
        "open": html.escape("&".join(f"{k}={v}" for k, v in (opening or {}).items())),
    })


def write_page(ma: ModelAttention, path, text: str | None = None) -> Path:
    """Write the self-contained page for `ma` to `path` (UTF-8); returns the path."""
    path = Path(path)
    path.write_text(page_html(ma, text), encoding="utf-8")
    return path
