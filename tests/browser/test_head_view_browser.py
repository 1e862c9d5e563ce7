"""The head view overlays several heads, each in its colour (bertviz's head view): `heads=[...]`
picks the ones drawn first, a click on a head's square shows or hides it, a double-click shows it
alone (and again: every head); a hovered token still gives one head's numbers, and a box per
shown head beside each token on the other side at that head's weight. Each head's colour stands
out from the page in both themes."""

from __future__ import annotations

import pytest
import torch

import attnlab.viz as viz
from attnlab.viz.page import page_html
from browser.helpers_browser import pct, texts
from viz.fakes import fake_capture

TOKENS = ["[CLS]", "the", "cat", "sat", "[SEP]"]


def _drawn(page) -> dict[int, dict]:
    """{head: {"colours": {stroke, ...}, "lines": {(i, j): opacity}}} of the head view."""
    rows = page.eval_on_selector_all(
        "#drawing .link", "els => els.map(e => [+e.dataset.h, +e.dataset.i, +e.dataset.j, "
        "+e.getAttribute('stroke-opacity'), e.getAttribute('stroke')])")
    out: dict[int, dict] = {}
    for h, i, j, opacity, stroke in rows:
        d = out.setdefault(h, {"colours": set(), "lines": {}})
        d["colours"].add(stroke)
        d["lines"][(i, j)] = opacity
    return out


def _check_weights(drawn, att, layer, heads):
    assert sorted(drawn) == heads
    for h in heads:
        w = att[layer][0, h]
        want = {(i, j): float(w[i, j]) / len(heads) for i in range(5) for j in range(5)
                if float(w[i, j]) >= 0.002}
        assert drawn[h]["lines"].keys() == want.keys()
        assert max(abs(o - want[k]) for k, o in drawn[h]["lines"].items()) < 1e-4


def test_heads_are_overlaid_toggled_and_shown_alone(open_page, tmp_path):
    torch.manual_seed(0)
    att = tuple(torch.randn(3, 1, 4, 5, 5).softmax(-1))  # (layers, batch, H, L, S)
    path = viz.save(viz.head_view(att, TOKENS, layer=1, heads=[1, 3], html_action="return"),
                    tmp_path / "h.html")
    page, watch = open_page(path.as_uri(), allowed=[path.as_uri()])
    page.wait_for_selector("#drawing .link", state="attached")
    drawn = _drawn(page)
    _check_weights(drawn, att, 1, [1, 3])
    colours = [c for h in (1, 3) for c in drawn[h]["colours"]]
    assert len(colours) == 2 and colours[0] != colours[1]  # one colour per head, two heads
    shown = "els => els.map(e => e.getAttribute('data-shown'))"
    assert page.eval_on_selector_all("#drawing .head-square", shown) == [
        "false", "true", "false", "true"]
    page.hover(".tok.q[data-index='2']")  # one head's numbers (the first), both heads' lines
    assert texts(page, "#drawing .keys .pct") == [pct(w) for w in att[1][0, 1, 2]]
    visible = page.eval_on_selector_all(
        "#drawing .link", "els => els.filter(e => e.getAttribute('display') !== 'none')"
                          ".map(e => [+e.dataset.h, +e.dataset.i])")
    assert {i for _, i in visible} == {2} and {h for h, _ in visible} == {1, 3}

    square = "#drawing .head-square[data-head='{}']".format
    page.click(square(3))  # hide head 3
    _check_weights(_drawn(page), att, 1, [1])
    page.click(square(1))  # the last head shown stays
    _check_weights(_drawn(page), att, 1, [1])
    page.click(square(0))  # show head 0: its numbers now
    _check_weights(_drawn(page), att, 1, [0, 1])
    assert page.input_value("#head") == "0"
    page.dblclick(square(2))  # head 2 alone
    _check_weights(_drawn(page), att, 1, [2])
    page.dblclick(square(2))  # again: every head
    _check_weights(_drawn(page), att, 1, [0, 1, 2, 3])
    page.select_option("#head", "3")  # the head list: that head alone, as before
    _check_weights(_drawn(page), att, 1, [3])
    page.click(".tab[data-view='step']")
    assert page.get_attribute("#drawing", "data-head") == "3"
    assert "weights only" in page.text_content("#drawing")
    assert watch.errors == [] and watch.outside() == [] and watch.dialogs == []


def _luminance(colour: str) -> float:
    c = [int(colour[k:k + 2], 16) / 255 for k in (1, 3, 5)]
    c = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in c]
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]


def _contrast(a: str, b: str) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _long(colour: str) -> str:
    return "#" + "".join(2 * ch for ch in colour[1:]) if len(colour) == 4 else colour


@pytest.mark.parametrize("theme", ["dark", "light"])
def test_every_heads_colour_is_readable(open_page, tmp_path, theme):
    ma = fake_capture(TOKENS, n_layers=1, n_heads=12, d=4)
    path = tmp_path / f"{theme}.html"
    path.write_text(page_html(ma, opening={"view": "head", "heads": "all"}, theme=theme),
                    encoding="utf-8")
    page, watch = open_page(path.as_uri(), allowed=[path.as_uri()])
    page.wait_for_selector("#drawing .link", state="attached")
    drawn = _drawn(page)
    assert sorted(drawn) == list(range(12))
    colours = [next(iter(drawn[h]["colours"])) for h in range(12)]
    assert len(set(colours)) == 12
    background = _long(page.get_attribute("#drawing .background", "fill"))
    low = {c: round(_contrast(c, background), 2) for c in colours if _contrast(c, background) < 3}
    assert low == {}, f"{theme}: head colours under 3:1 against {background}: {low}"
    right, width = page.eval_on_selector(  # twelve heads named in the caption: it still fits
        "#drawing .caption", "e => [e.getBBox().x + e.getBBox().width, "
        "e.ownerSVGElement.width.baseVal.value]")
    assert right <= width, (right, width, page.text_content("#drawing .caption"))
    assert watch.errors == [] and watch.outside() == []


def _boxes(page) -> dict[tuple[int, int, int], tuple[float, str, float]]:
    """{(head, i, j): (fill opacity, fill, x)} of the boxes a hovered token draws."""
    rows = page.eval_on_selector_all(
        "#drawing .head-box", "els => els.map(e => [+e.dataset.h, +e.dataset.i, +e.dataset.j, "
        "+e.getAttribute('fill-opacity'), e.getAttribute('fill'), +e.getAttribute('x')])")
    return {(h, i, j): (o, fill, x) for h, i, j, o, fill, x in rows}


def _check_boxes(page, w, heads, pairs):
    """One box per shown head and pair, opacity = that head's weight, in the head's colour
    (its lines'), the heads side by side in head order."""
    colours = {h: next(iter(d["colours"])) for h, d in _drawn(page).items()}
    boxes = _boxes(page)
    assert boxes.keys() == {(h, i, j) for h in heads for i, j in pairs}
    for (h, i, j), (opacity, fill, _) in boxes.items():
        assert abs(opacity - float(w[h, i, j])) < 1e-3, (h, i, j, opacity)
        assert fill == colours[h]
    for i, j in pairs:
        xs = [boxes[(h, i, j)][2] for h in heads]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)


def test_hovered_token_draws_a_box_per_shown_head(open_page, tmp_path):
    toks = ["[CLS]", "the", "cat", "[SEP]", "it", "slept", "[SEP]"]
    torch.manual_seed(5)
    att = tuple(torch.randn(2, 1, 4, 7, 7).softmax(-1))  # (layers, batch, H, L, S)
    path = viz.save(viz.head_view(att, toks, layer=1, heads=[1, 3], sentence_b_start=4,
                                  html_action="return"), tmp_path / "boxes.html")
    page, watch = open_page(path.as_uri(), allowed=[path.as_uri()])
    page.wait_for_selector("#drawing .link", state="attached")
    w = att[1][0]
    assert page.locator("#drawing .head-box").count() == 0
    page.hover(".tok.q[data-index='2']")  # beside each key: heads 1 and 3, weight (2, j)
    _check_boxes(page, w, [1, 3], [(2, j) for j in range(7)])
    key_x = float(page.get_attribute(".tok.k[data-index='0'] rect", "x"))
    assert min(x for _, _, x in _boxes(page).values()) >= key_x
    page.hover(".tok.k[data-index='5']")  # the reverse: beside each query, weight (i, 5)
    _check_boxes(page, w, [1, 3], [(i, 5) for i in range(7)])
    page.hover("#meta")  # mouse out: no boxes
    assert page.locator("#drawing .head-box").count() == 0
    page.click("#drawing .head-square[data-head='3']")  # hide head 3: head 1's boxes alone
    page.hover(".tok.q[data-index='1']")
    _check_boxes(page, w, [1], [(1, j) for j in range(7)])
    page.click("#drawing .head-square[data-head='0']")
    page.select_option("#filter", "3")  # Sentence A -> Sentence B: boxes beside B's tokens only
    page.wait_for_selector("#drawing[data-choice='3']", state="attached")
    page.hover(".tok.q[data-index='2']")
    _check_boxes(page, w, [0, 1], [(2, j) for j in range(4, 7)])
    page.hover("#meta")
    assert page.locator("#drawing .head-box").count() == 0
    assert watch.errors == [] and watch.outside() == [] and watch.dialogs == []


def test_cross_attention_boxes_in_both_themes(open_page, tmp_path):
    torch.manual_seed(6)
    enc = tuple(torch.randn(2, 1, 4, 5, 5).softmax(-1))
    dec = tuple(torch.randn(2, 1, 4, 3, 3).softmax(-1))
    cross = tuple(torch.randn(2, 1, 4, 3, 5).softmax(-1))  # decoder queries x encoder keys
    obj = viz.head_view(encoder_attention=enc, decoder_attention=dec, cross_attention=cross,
                        encoder_tokens=TOKENS, decoder_tokens=["<pad>", "le", "chat"], layer=0,
                        heads=[1, 3], html_action="return")
    path = viz.save(obj, tmp_path / "cross.html")
    page, watch = open_page(path.as_uri(), allowed=[path.as_uri()])
    page.wait_for_selector("#drawing .link", state="attached")
    page.select_option("#filter", "2")  # Cross
    page.wait_for_selector("#drawing[data-choice='2']", state="attached")
    w = cross[0][0]
    seen = []
    for theme in ("light", "dark"):
        page.evaluate(f"document.body.setAttribute('data-theme', '{theme}')")
        page.click(".tab[data-view='head']")  # redraw in that theme
        page.hover(".tok.q[data-index='1']")  # a decoder token: boxes beside the encoder's
        _check_boxes(page, w, [1, 3], [(1, j) for j in range(5)])
        page.hover(".tok.k[data-index='4']")  # an encoder token: beside the decoder's
        _check_boxes(page, w, [1, 3], [(i, 4) for i in range(3)])
        background = page.get_attribute("#drawing .background", "fill")
        halos = page.eval_on_selector_all("#drawing .tok text",
                                          "els => els.map(e => e.getAttribute('stroke'))")
        assert set(halos) == {background}  # token text keeps a halo of the page over boxes
        seen.append(page.eval_on_selector_all("#drawing .head-box", "els => els.map("
                                              "e => e.getAttribute('fill'))"))
        page.hover("#meta")
        assert page.locator("#drawing .head-box").count() == 0
    assert seen[0] != seen[1]  # each theme's own head colours
    assert watch.errors == [] and watch.outside() == [] and watch.dialogs == []
