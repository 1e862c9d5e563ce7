"""End to end with the packaged all-MiniLM-L6-v2: `attnlab view` writes the page, Chromium shows
the model's weights, and the step view rebuilds them from the model's q, k, v."""

from __future__ import annotations

import re

import numpy as np
import pytest

from attnlab.cli import main
from browser.helpers_browser import pct, texts

TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    from attnlab.explain.model import run_model

    out = tmp_path_factory.mktemp("real") / "view.html"
    assert main(["view", TEXT, "-o", str(out)]) == 0
    return out.as_uri(), run_model(TEXT)  # the loaded model is cached: this run is quick


@pytest.mark.slow
def test_real_model_page(open_page, real):
    url, ma = real
    page, watch = open_page(url, allowed=[url])
    assert page.locator("#layer option").count() == 6 and page.locator("#head option").count() == 12
    i = ma.tokens.index("it")
    page.select_option("#layer", "3")
    page.select_option("#head", "5")
    page.hover(f".tok.q[data-index='{i}']")
    assert texts(page, "#drawing .keys .pct") == [pct(w) for w in ma.weights[3, 5, i]]
    page.click(".tab[data-view=step]")
    page.select_option("#token", str(i))
    assert texts(page, "#drawing .softmax") == [pct(w) for w in ma.weights[3, 5, i]]
    diff = float(re.search(r"= (\S+)$", page.text_content("#drawing .check")).group(1))
    assert diff < 1e-5  # float32 q, k in the page against the model's own weights
    assert np.isclose(ma.weights[3, 5, i].sum(), 1.0)
    assert watch.errors == [] and watch.outside() == []
