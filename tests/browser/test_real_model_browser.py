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


@pytest.mark.slow
def test_head_view_of_minilm_outputs_offline(open_page, tmp_path, monkeypatch):
    """bertviz's one line on the real model run by transformers itself (eager, its own
    output_attentions): the page's decoded data is the model's weights and its tokens."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModel, AutoTokenizer

    import attnlab.viz as viz
    from attnlab.explain.model import default_model_path

    where = default_model_path()
    tok = AutoTokenizer.from_pretrained(where, local_files_only=True)
    model = AutoModel.from_pretrained(where, local_files_only=True,
                                      attn_implementation="eager").eval()
    enc = tok(TEXT, return_tensors="pt")
    with torch.no_grad():
        out = model(**enc, output_attentions=True)
    tokens = tok.convert_ids_to_tokens(enc["input_ids"][0])
    path = viz.save(viz.head_view(out.attentions, tokens, html_action="return"),
                    tmp_path / "minilm.html")
    url = path.as_uri()
    page, watch = open_page(url, allowed=[url])
    page.wait_for_selector("#drawing .link", state="attached")
    got = np.array(page.evaluate("Array.from(attnlabState.data.W)"))
    want = torch.stack([a[0] for a in out.attentions]).numpy()  # (6, 12, L, L)
    assert want.shape[:2] == (6, 12) and got.size == want.size
    assert np.abs(got.reshape(want.shape) - want).max() <= 1e-6
    assert page.evaluate("attnlabState.data.qTok") == tokens
    assert texts(page, "#drawing .keys .tok title") == tokens
    assert [u for u in watch.requests if u != url] == [] and watch.outside() == []
    assert watch.errors == []
