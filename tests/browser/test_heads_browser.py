"""The page's Heads view in headless Chromium: the layers x heads grid carries head_stats'
numbers and labels, the statistic is selectable, and a click opens that head."""

from __future__ import annotations

import pytest

from attnlab.explain.head_statistics import head_stats
from attnlab.explain.head_words import head_words
from attnlab.viz.page import write_page
from viz.fakes import XSS, fake_capture

TOKENS = ["The", "cat", "sat", XSS, "on", "the", "mat", "because", "it", "was", "tired", "."]


@pytest.fixture(scope="module")
def capture():
    return fake_capture(TOKENS, n_layers=3, n_heads=4, d=8)


@pytest.fixture
def page(clean_page, capture, tmp_path):
    path = tmp_path / "view.html"
    write_page(capture, path)
    url = path.as_uri() + "#view=heads&stat=first"
    return clean_page(url, "#drawing .headcell", allowed=[path.as_uri()])


def cells(page):
    return page.eval_on_selector_all(
        "#drawing .headcell", "els => els.map(e => [+e.dataset.layer, +e.dataset.head, "
        "e.dataset.value === '' ? null : +e.dataset.value, e.dataset.label, "
        "e.querySelector('title').textContent])")


def test_grid_shows_the_statistic_and_labels(page, capture):
    stats = head_stats(capture)
    got = cells(page)
    assert len(got) == 12 and page.get_attribute("#drawing", "data-stat") == "first"
    for l, h, value, label, title in got:
        assert value == pytest.approx(stats["first"][l, h], abs=1e-6)
        assert label == stats.labels[l][h]
        assert title.startswith(f"layer {l}, head {h}: {label} (first = ")
        assert title.endswith("\n" + head_words(stats, l, h))  # the label in words: why, why none
    page.select_option("#stat", "prev")
    assert page.get_attribute("#drawing", "data-stat") == "prev"
    for l, h, value, _, _ in cells(page):
        assert value == pytest.approx(stats["prev"][l, h], abs=1e-6)
    assert "previous-token: prev >= 0.5" in page.text_content("#readout")


def test_clicking_a_cell_opens_the_head(page):
    page.click("#drawing .headcell[data-layer='2'][data-head='1']")
    assert page.get_attribute("#drawing", "data-view") == "head"
    assert page.get_attribute("#drawing", "data-layer") == "2"
    assert page.get_attribute("#drawing", "data-head") == "1"


def test_rollout_is_a_matrix_of_the_model_view(page, capture):
    from attnlab.explain.attention_flow import rollout

    page.click(".tab[data-view='model']")
    assert page.locator("#drawing .thumb").count() == 12
    page.click("#drawing .rollout-thumb")
    assert page.get_attribute("#drawing", "data-view") == "head"
    assert page.get_attribute("#drawing", "data-matrix") == "rollout"
    want = rollout(capture.weights)
    got = page.eval_on_selector_all(
        "#drawing .link", "els => els.map(e => [+e.dataset.i, +e.dataset.j, "
        "+e.getAttribute('stroke-opacity')])")
    assert len(got) > len(TOKENS)
    for i, j, opacity in got:
        assert opacity == pytest.approx(want[i, j], abs=1e-4)
    page.select_option("#head", "1")  # picking a head leaves the rollout
    assert page.get_attribute("#drawing", "data-matrix") == "head"
