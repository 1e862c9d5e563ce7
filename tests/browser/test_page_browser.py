"""The offline page in headless Chromium: clean load with no network, head picking, hover,
model view, step view, PNG/SVG export, and the XSS sentence staying text."""

from __future__ import annotations

import re

import numpy as np
import pytest

from attnlab.explain.page_payload import opening
from attnlab.viz.page import write_page
from browser.helpers_browser import check_png, check_svg, export, lines, pct, texts
from viz.fakes import XSS, fake_capture

TOKENS = ["The", "cat", "sat", XSS, "on", "the", "mat", "because", "it", "was", "tired"]
TEXT = "The cat sat " + XSS + " on the mat because it was tired"


@pytest.fixture(scope="module")
def capture():
    return fake_capture(TOKENS, n_layers=3, n_heads=4, d=8)


@pytest.fixture(scope="module")
def page_url(capture, tmp_path_factory):
    path = tmp_path_factory.mktemp("page") / "view.html"
    write_page(capture, path, text=TEXT)
    return path.as_uri()


@pytest.fixture
def page(clean_page, page_url):
    return clean_page(page_url, "#drawing .link")  # nothing but the file itself


def test_loads_on_the_top_head_for_it_pinned(page, capture):
    o = opening(capture)  # the head explain ranks first for "it"
    assert o["token"] == TOKENS.index("it")
    assert page.get_attribute("#drawing", "data-view") == "head"
    assert page.evaluate("[attnlabState.layer, attnlabState.head, attnlabState.pinned]") == [
        o["layer"], o["head"], o["token"]]
    got = lines(page)
    assert len(got) > len(TOKENS)
    for i, j, opacity in got:
        assert capture.mask[i, j]
        assert opacity == pytest.approx(capture.weights[o["layer"], o["head"], i, j], abs=1e-4)


def test_picking_layer_and_head_redraws(page, capture):
    before = lines(page)
    page.select_option("#layer", "2")
    page.select_option("#head", "3")
    assert page.get_attribute("#drawing", "data-layer") == "2"
    assert page.get_attribute("#drawing", "data-head") == "3"
    after = lines(page)
    assert after != before
    for i, j, opacity in after:
        assert opacity == pytest.approx(capture.weights[2, 3, i, j], abs=1e-4)


def test_hover_isolates_a_token_and_shows_its_weights(page, capture):
    page.select_option("#layer", "0")
    page.select_option("#head", "0")
    i = 8  # "it"
    page.hover(f".tok.q[data-index='{i}']")
    expected = [pct(capture.weights[0, 0, i, j]) if capture.mask[i, j] else "masked"
                for j in range(len(TOKENS))]
    assert texts(page, "#drawing .keys .pct") == expected
    visible = page.eval_on_selector_all(
        "#drawing .link", "els => els.filter(e => e.getAttribute('display') !== 'none')"
                          ".map(e => +e.dataset.i)")
    assert visible and set(visible) == {i}
    best = int(np.argmax(capture.weights[0, 0, i]))
    readout = page.inner_text("#readout")
    assert f"{TOKENS[best]}\u201d {pct(capture.weights[0, 0, i, best])}" in readout
    page.hover(".tok.q[data-index='2']")
    page.mouse.move(1, 1)  # back to the pinned token's weights
    assert texts(page, "#drawing .keys .pct") == expected
    page.click(".tok.q[data-index='8']")  # unpinned: nothing
    page.mouse.move(1, 1)
    assert set(texts(page, "#drawing .keys .pct")) == {""}


def test_model_view_thumbnail_opens_head(page):
    page.click(".tab[data-view=model]")
    assert page.locator("#drawing .thumb").count() == 3 * 4
    page.click("#drawing .thumb[data-layer='1'][data-head='2']")
    assert page.get_attribute("#drawing", "data-view") == "head"
    assert (page.input_value("#layer"), page.input_value("#head")) == ("1", "2")


def test_step_view_reproduces_the_weights(page, capture):
    page.select_option("#layer", "1")
    page.select_option("#head", "2")
    page.click(".tab[data-view=step]")
    page.select_option("#token", "6")
    assert page.get_attribute("#drawing", "data-token") == "6"
    assert texts(page, "#drawing .softmax") == [pct(w) for w in capture.weights[1, 2, 6]]
    check = page.text_content("#drawing .check")
    assert float(re.search(r"= (\S+)$", check).group(1)) < 1e-6
    t = capture.head_trace(1, 2)
    out = page.text_content("#drawing").split("output = \u03a3 weight \u00d7 value = [")[1]
    first = float(out.split(",")[0].replace("\u2212", "-"))
    assert first == pytest.approx(t.output[6, 0], abs=1e-3)


def test_export_png_and_svg(page):
    name, png = export(page, "#export-png")
    assert name.endswith(".png")
    width = int(page.get_attribute("#drawing", "width"))
    check_png(png, min_width=2 * width)
    name, svg = export(page, "#export-svg")
    assert name.endswith(".svg")
    check_svg(svg, ["cat", "tired"])
    page.click(".tab[data-view=model]")
    _, png = export(page, "#export-png")
    check_png(png, min_width=500)


def test_xss_sentence_stays_text(page):
    assert page.inner_text("#title") == TEXT
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    titles = texts(page, "#drawing .tok title")
    assert titles.count(XSS) == 2  # once on each side of the head view
    assert "3: <img src=x onerror" in page.inner_text("#token")  # shortened, but text
    page.hover(".tok.q[data-index='3']")
    assert XSS in page.inner_text("#readout")


def test_weights_only_capture(open_page, tmp_path):
    path = tmp_path / "w.html"
    write_page(fake_capture(TOKENS[:4], qkv=False), path)
    page, watch = open_page(path.as_uri(), allowed=[path.as_uri()])
    page.click(".tab[data-view=step]")
    assert "weights only" in page.text_content("#drawing")
    assert watch.errors == []


def test_link_opens_a_state_and_click_pins_a_token(open_page, page_url, capture):
    page, watch = open_page(page_url + "#layer=2&head=1&pin=8", allowed=[page_url])
    assert (page.get_attribute("#drawing", "data-layer"),
            page.get_attribute("#drawing", "data-head")) == ("2", "1")
    expected = [pct(capture.weights[2, 1, 8, j]) if capture.mask[8, j] else "masked"
                for j in range(len(TOKENS))]
    assert texts(page, "#drawing .keys .pct") == expected  # pinned without any hover
    page.click(".tok.q[data-index='8']")  # unpin
    page.mouse.move(1, 1)
    assert set(texts(page, "#drawing .keys .pct")) == {""}
    page.click(".tok.q[data-index='5']")
    page.mouse.move(1, 1)
    assert texts(page, "#drawing .keys .pct")[0] == pct(capture.weights[2, 1, 5, 0])
    assert page.input_value("#token") == "5"
    assert watch.errors == []
    page, watch = open_page(page_url + "#view=step&layer=1&head=0&token=4", allowed=[page_url])
    assert page.get_attribute("#drawing", "data-view") == "step"
    assert page.get_attribute("#drawing", "data-token") == "4"
    assert watch.errors == []
