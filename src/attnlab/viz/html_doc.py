"""The HTML document every offline page shares (the view page and the lesson page): one <head>
(charset, Content-Security-Policy, viewport, title, inline style) and a <body> that ends in the
page's JSON data block and its one inline script.

The policy allows exactly that script (by its SHA-256), inline style, data:/blob: images, and no
request at all (`connect-src 'none'`; the web app's page may call back to its own origin). Text
from outside (the title, attribute values) is HTML-escaped; the data goes in as JSON that cannot
end or confuse its <script> block; the whole document is filled in one pass, so a token that reads
"{js}" is never substituted again.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from functools import cache
from importlib import resources

from attnlab.errors import AttnlabError

_DOCUMENT = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style>
</head>
<body{attrs}>
{body}{data}<script>{js}</script>
</body>
</html>
"""


@cache
def asset(name: str) -> str:
    return resources.files("attnlab.viz").joinpath("assets", name).read_text(encoding="utf-8")


def json_for_script(obj) -> str:
    """JSON safe inside <script>: no `</script>`, `<!--` or `&` can end or confuse the block."""
    s = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def fill(template: str, parts: dict[str, str]) -> str:
    # one pass, so text inside a part (a token "{js}") is never substituted again
    return re.sub(r"\{(\w+)\}", lambda m: parts[m.group(1)], template)


def script_source(js: str) -> str:
    """The CSP source that allows exactly the inline script `js`."""
    digest = hashlib.sha256(js.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def policy(js: str, connect: str = "'none'") -> str:
    """The Content-Security-Policy of a page whose one script is `js`; `connect` is where the
    script may send requests ("'none'", or "'self'" for the web app's page)."""
    return (f"default-src 'none'; script-src {script_source(js)}; style-src 'unsafe-inline'; "
            f"img-src data: blob:; connect-src {connect}; base-uri 'none'; form-action 'none'")


def document(*, title: str, css: str, js: str, body: str, attrs: dict[str, str] | None = None,
             data: tuple[str, object] | None = None, connect: str = "'none'") -> str:
    """The whole page: `body` (trusted markup from the assets) inside the shared head; `attrs`
    the <body>'s data attributes (escaped); `data` an (id, JSON-ready object) written as an
    application/json block the script reads; css and js inlined as they are (our assets)."""
    for name, text, end in (("css", css, "</style"), ("js", js, "</script")):
        if end in text.lower():
            raise AttnlabError(f"{name}: an inline asset may not contain {end!r}")
    attr_text = ""
    for k, v in (attrs or {}).items():
        if not re.fullmatch(r"[a-z][a-z0-9-]*", k):
            raise AttnlabError(f"attrs: expected an attribute name, got {k!r}")
        attr_text += f' {k}="{html.escape(str(v), quote=True)}"'
    block = ""
    if data is not None:
        block = (f'<script type="application/json" id="{html.escape(data[0], quote=True)}">'
                 f"{json_for_script(data[1])}</script>\n")
    return fill(_DOCUMENT, {"csp": html.escape(policy(js, connect)), "title": html.escape(title),
                            "css": css, "attrs": attr_text, "body": body, "data": block,
                            "js": js})
