"""Reading the drawing back out of the page, for comparison with the capture's numbers."""

from __future__ import annotations

import xml.etree.ElementTree as ET


def lines(page):
    """(i, j, opacity) of every head-view line."""
    return page.eval_on_selector_all(
        "#drawing .link", "els => els.map(e => [+e.dataset.i, +e.dataset.j, "
        "+e.getAttribute('stroke-opacity')])")


def texts(page, selector):
    return page.eval_on_selector_all(selector, "els => els.map(e => e.textContent)")


def pct(w) -> str:
    return f"{100 * float(w):.1f}%"


def export(page, button):
    with page.expect_download() as info:
        page.click(button)
    return info.value.suggested_filename, open(info.value.path(), "rb").read()


def check_png(data: bytes, min_width: int):
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= min_width and height > 50 and len(data) > 2000, (width, height, len(data))


def check_svg(data: bytes, must_contain: list[str]):
    root = ET.fromstring(data)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    words = {t.text for t in root.iter("{http://www.w3.org/2000/svg}text") if t.text}
    for w in must_contain:
        assert w in words, (w, sorted(words)[:20])
