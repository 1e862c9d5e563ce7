"""The effects page in headless Chromium: loads offline without errors, two layer × head grids,
clicking a head shows its steps and effect, the logit lens table, and text stays text."""

from __future__ import annotations

import pytest

from attnlab.explain.effects import ablation_effects
from attnlab.explain.model import load_model
from attnlab.viz.effects_page import write_effects_page
from browser.helpers_browser import texts
from interventions import models

TEXT = "<b>it</b> sat on the mat"


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    path = models.tiny_checkpoint(tmp_path_factory.mktemp("gpt") / "run")
    return ablation_effects(TEXT, load_model(path), token="mat")


@pytest.fixture(scope="module")
def page_url(fx, tmp_path_factory):
    path = tmp_path_factory.mktemp("fx") / "effects.html"
    write_effects_page(fx, path)
    return path.as_uri()


def test_grids_click_steps_and_lens(clean_page, page_url, fx):
    page = clean_page(page_url, "#effect-grid td", "#lens td")
    assert page.eval_on_selector_all("#effect-grid td", "t => t.length") == 2 * 4
    assert page.eval_on_selector_all("#weight-grid td", "t => t.length") == 2 * 4
    page.click("#effect-grid tr:nth-child(3) td:nth-of-type(2)")  # layer 1, head 1
    assert page.evaluate("window.attnlabEffects.selected") == [1, 1]
    assert page.text_content("#detail-title") == "layer 1 head 1"
    assert f"{fx.effect[1, 1]:.4f}" in page.text_content("#detail-text")
    rows = texts(page, "#steps tr td:first-child")
    assert rows == fx.tokens  # one row per key, the tokens as text
    assert page.eval_on_selector_all("#lens tr", "t => t.length") == 1 + 3
    assert page.eval_on_selector_all("b", "b => b.length") == 0  # the <b> in the text is text
    assert TEXT in page.text_content("#meta")


def test_a_patch_page_says_what_its_effect_is(clean_page, tmp_path):
    from attnlab.explain.effects import patch_effects

    path = models.tiny_checkpoint(tmp_path / "run")
    fx = patch_effects("the cat sat", "the mat sat", load_model(path))
    out = write_effects_page(fx, tmp_path / "patch.html")
    page = clean_page(out.as_uri(), "#effect-grid td")
    assert "share of the gap" in page.text_content("#effect-caption")
    assert "the cat sat" in page.text_content("#meta") and "clean" in page.text_content("#meta")
    assert page.evaluate("window.attnlabEffects.selected") is not None  # the largest, selected
