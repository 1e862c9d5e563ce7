"""The pages Jupyter shows (a view returned by head_view / model_view, a ModelAttention, the
explorable lesson) share one wrapper: the same sandboxed iframe around the page, the page's own
Content-Security-Policy, and `.data` / `.save(path)` on what is returned."""

from __future__ import annotations

import html
import re

import attnlab.viz as viz
from attnlab.viz.lesson_page import lesson_html
from attnlab.viz.notebook import model_html
from attnlab.viz.page import page_html
from viz.fakes import XSS, fake_capture

IFRAME = re.compile(r'<iframe srcdoc="([^"]*)" sandbox="([^"]*)" '
                    r'style="width:100%;height:(\d+)px;border:1px solid #ddd" '
                    r'title="([^"]*)"></iframe>')


def _frame(doc: str) -> tuple[str, str, int, str]:
    m = IFRAME.fullmatch(doc)
    assert m, doc[:200]
    return html.unescape(m.group(1)), m.group(2), int(m.group(3)), m.group(4)


def _views():
    ma = fake_capture(["x", XSS, "z"])
    return ma, viz.head_view(ma, html_action="return"), viz.model_view(ma, html_action="return")


def test_every_notebook_page_is_one_sandboxed_iframe_around_its_page():
    ma, head, model = _views()
    lesson = viz.lesson_view(height=700)
    frames = {"head": (_frame(head._repr_html_()), head.data),
              "model": (_frame(model._repr_html_()), model.data),
              "capture": (_frame(model_html(ma)), page_html(ma)),
              "lesson": (_frame(lesson._repr_html_()), lesson_html())}
    for name, ((inner, sandbox, _, title), page) in frames.items():
        assert inner == page, name
        assert "allow-same-origin" not in sandbox and sandbox.startswith("allow-scripts"), name
        assert title.startswith("attnlab"), name
        # the page inside keeps its own policy: no requests at all
        csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', inner)
        assert csp and "connect-src 'none'" in html.unescape(csp.group(1)), name
    assert {frames[k][0][1] for k in ("head", "model", "capture")} == {
        "allow-scripts allow-downloads"}  # the views' PNG / SVG export
    assert frames["lesson"][0][1] == "allow-scripts"
    assert [frames[k][0][2] for k in frames] == [640, 640, 640, 700]


def test_every_notebook_page_has_data_and_save(tmp_path):
    _, head, _ = _views()
    lesson = viz.lesson_view()
    assert lesson.data == lesson_html() == lesson.html
    for name, page in (("head", head), ("lesson", lesson)):
        out = page.save(tmp_path / f"{name}.html")
        assert out.read_text(encoding="utf-8") == page.data
        assert viz.save(page, tmp_path / f"{name}-2.html").read_text(encoding="utf-8") == page.data
        assert f"{len(page.data)} characters" in repr(page)
