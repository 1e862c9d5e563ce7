"""The document both offline pages share: one head, a policy that allows exactly the page's script,
escaped title and attributes, data that cannot close its block, and assets that cannot either."""

from __future__ import annotations

import html
import json
import re

import pytest

from attnlab.viz.html_doc import document, policy
from attnlab.viz.lesson_page import lesson_csp, lesson_html
from attnlab.viz.page import csp, page_html
from viz.fakes import XSS, fake_capture


def _head(doc: str) -> str:
    """The head less what differs by design: title, style and the policy's script hash."""
    head = doc.split("<body", 1)[0]
    return re.sub(r"<(title|style)>.*?</\1>|&#x27;sha256-[^&]+&#x27;", "", head, flags=re.S)


def _policy(doc: str) -> str:
    return html.unescape(re.search(r'Content-Security-Policy" content="([^"]+)"', doc).group(1))


def test_view_and_lesson_pages_share_one_head():
    view, lesson = page_html(fake_capture(["a", "b"])), lesson_html()
    assert _head(view) == _head(lesson)
    assert _policy(view) == csp() and _policy(lesson) == lesson_csp()


def test_text_from_outside_stays_text():
    doc = document(title=XSS + "{js}", css="p{}", js="var a = 1;", body="<p>{x}</p>\n",
                   attrs={"data-open": '"><img src=x>'}, data=("d", {"t": "</script>" + XSS}))
    assert "<img" not in doc and doc.count("<script") == 2 and "{js}" in doc
    assert "<p>{x}</p>" in doc  # the body is never filled again
    block = re.search(r'id="d">(.*?)</script>', doc, re.S).group(1)
    assert json.loads(block)["t"] == "</script>" + XSS
    assert "connect-src 'none'" in _policy(doc) and _policy(doc) == policy("var a = 1;")


@pytest.mark.parametrize("part", ["css", "js"])
def test_an_asset_cannot_close_its_own_block(part):
    parts = {"css": "p{}", "js": "1;"}
    parts[part] = "x</STYLE>" if part == "css" else "x</Script>"
    with pytest.raises(ValueError, match=f"^{part}: "):
        document(title="t", body="", **parts)


def test_bad_assets_and_attributes_are_attnlab_errors():
    from attnlab.errors import AttnlabError

    with pytest.raises(AttnlabError, match=r"^js: an inline asset may not contain '</script'"):
        document(title="t", css="", js="x</script>", body="")
    with pytest.raises(AttnlabError, match=r"^attrs: expected an attribute name, got 'on load'"):
        document(title="t", css="", js="", body="", attrs={"on load": "x"})
