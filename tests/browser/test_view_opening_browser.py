"""`attnlab view TEXT --token it` opens where the README's picture is: layer 2, head 8, "it"
pinned, 76.7% on "tired"; the token menu pins what it chooses."""

from __future__ import annotations

import pytest

from attnlab.cli import main
from browser.helpers_browser import pct, texts

TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def view(tmp_path_factory):
    from attnlab.explain.model import run_model

    out = tmp_path_factory.mktemp("opening") / "view.html"
    assert main(["view", TEXT, "--token", "it", "-o", str(out)]) == 0
    return out.as_uri(), run_model(TEXT)


@pytest.mark.slow
def test_view_opens_on_the_top_head_with_it_pinned(open_page, view):
    url, ma = view
    page, watch = open_page(url, allowed=[url])
    page.wait_for_selector("#drawing .link", state="attached")
    s = page.evaluate("({l: attnlabState.layer, h: attnlabState.head, p: attnlabState.pinned,"
                      " v: attnlabState.view})")
    it, tired = ma.tokens.index("it"), ma.tokens.index("tired")
    assert s == {"l": 2, "h": 8, "p": it, "v": "head"}
    assert page.input_value("#layer") == "2" and page.input_value("#head") == "8"
    assert page.input_value("#token") == str(it)
    shown = texts(page, "#drawing .keys .pct")
    assert shown == [pct(w) for w in ma.weights[2, 8, it]]
    assert shown[tired] == "76.7%"
    # only the pinned token's lines are drawn
    visible = page.eval_on_selector_all(
        "#drawing .link", "els => els.filter(e => e.getAttribute('display') !== 'none')"
        ".map(e => +e.dataset.i)")
    assert visible and set(visible) == {it}
    # the token menu pins: "2: cat" shows cat's weights without a hover
    cat = ma.tokens.index("cat")
    page.select_option("#token", str(cat))
    assert page.evaluate("attnlabState.pinned") == cat
    assert texts(page, "#drawing .keys .pct") == [pct(w) for w in ma.weights[2, 8, cat]]
    assert watch.errors == [] and watch.outside() == []


@pytest.mark.slow
def test_link_fragment_wins_over_the_opening(open_page, view):
    url, _ = view
    page, watch = open_page(url + "#layer=4&head=1", allowed=[url])
    page.wait_for_selector("#drawing .link", state="attached")
    # the link chose the head: the page shows it as chosen, nothing pinned
    assert page.evaluate("[attnlabState.layer, attnlabState.head, attnlabState.pinned]") == [
        4, 1, None]
    assert watch.errors == []


@pytest.mark.slow
def test_step_view_carries_the_layer_walk_checked_against_the_model(open_page, view):
    url, ma = view
    page, watch = open_page(url, allowed=[url])
    page.wait_for_selector("#drawing .link", state="attached")
    page.click(".tab[data-view=step]")
    walk = page.evaluate("attnlabState.data.walk")
    assert (walk["layer"], walk["head"], walk["token"]) == (2, 8, ma.tokens.index("it"))
    assert max(walk["checks"].values()) < 1e-6
    q_line = page.text_content("#drawing .walk-q")
    assert q_line.startswith("q = x·W_q + b_q = [") and "checked" in q_line
    # the page's q is the captured query of the model (float32 capture: 1e-4)
    assert abs(walk["q"][0] - float(ma.queries[2, 8, walk["token"]][0])) < 1e-4
    assert "the layer's output" in page.text_content("#drawing .walk-out")
    page.select_option("#head", "3")  # another head: the walk says where it was computed
    assert "computed for layer 2, head 8" in page.text_content("#drawing .walk-elsewhere")
    assert watch.errors == []
