"""The step view replays each layer as the model ran it: Gemma 2's sliding-window layer with its
own mask and every layer's softcap, T5's position bias; its softmax is the model's weights."""

from __future__ import annotations

import re

from attnlab.viz.page import write_page
from browser.helpers_browser import pct, texts
from viz.fakes import recorded_capture


def _step(page, layer, head, token):
    page.click(".tab[data-view='step']")
    page.select_option("#layer", str(layer))
    page.select_option("#head", str(head))
    page.select_option("#token", str(token))
    page.wait_for_selector(f"#drawing[data-layer='{layer}'][data-head='{head}']"
                           f"[data-token='{token}']", state="attached")
    return float(re.search(r"= (\S+)$", page.text_content("#drawing .check")).group(1))


def test_step_view_uses_each_layers_mask_softcap_and_bias(open_page, tmp_path):
    for arch, says, cases in (("gemma2", "softcap 1\u00b7tanh(s/1)", [(0, 1, 7), (1, 3, 7)]),
                              ("t5", "+ bias", [(1, 2, 3)])):
        ma = recorded_capture(arch)
        url = write_page(ma, tmp_path / f"{arch}.html").as_uri()
        page, watch = open_page(url, allowed=[url])
        for layer, head, token in cases:
            diff = _step(page, layer, head, token)
            want = ma.weights[layer, head, token]
            assert texts(page, "#drawing .softmax") == [pct(w) for w in want]
            assert diff < 1e-5, (arch, layer, head, token, diff)
            assert says in page.text_content("#drawing .pipeline")
        if arch == "gemma2":  # the sliding layer's head view: keys outside the window are masked
            page.click(".tab[data-view='head']")
            page.select_option("#layer", "0")
            page.hover(".tok.q[data-index='7']")
            assert texts(page, "#drawing .keys .pct")[:4] == ["masked"] * 4
        assert watch.errors == [] and watch.outside() == []
