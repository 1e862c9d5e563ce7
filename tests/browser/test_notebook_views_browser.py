"""What head_view / model_view return, in headless Chromium: the page loads on the asked view and
layer with no network request, and the encoder-decoder document's pages load inside it."""

from __future__ import annotations

import torch

import attnlab.viz as viz
from browser.helpers_browser import lines

TOKENS = ["[CLS]", "the", "cat", "sat", "[SEP]"]


def _attentions(seed=0, causal=False):
    torch.manual_seed(seed)
    s = torch.randn(3, 1, 2, 5, 5)  # (layers, batch, H, L, S)
    if causal:
        s = s.masked_fill(~torch.tril(torch.ones(5, 5, dtype=torch.bool)), float("-inf"))
    return tuple(s.softmax(-1))


def _open(open_page, tmp_path, page_obj, name="view.html"):
    path = viz.save(page_obj, tmp_path / name)
    url = path.as_uri()
    page, watch = open_page(url, allowed=[url])
    return page, watch


def test_returned_page_opens_on_the_asked_view_offline(open_page, tmp_path):
    att = _attentions()
    page, watch = _open(open_page, tmp_path, viz.model_view(att, TOKENS, html_action="return"))
    page.wait_for_selector("#drawing[data-view='model']", state="attached")
    page, watch2 = _open(open_page, tmp_path, viz.head_view(att, TOKENS, layer=2, heads=[1],
                                                             html_action="return"), "h.html")
    page.wait_for_selector("#drawing .link", state="attached")
    assert page.evaluate("[attnlabState.view, attnlabState.layer, attnlabState.head]") \
        == ["head", 2, 1]
    for i, j, opacity in lines(page):
        assert abs(opacity - float(att[2][0, 1, i, j])) < 1e-4
    page.click(".tab[data-view='step']")
    assert "weights only" in page.text_content("#drawing")
    for w in (watch, watch2):
        assert w.errors == [] and w.outside() == [] and w.dialogs == []


def test_encoder_decoder_document_loads_both_pages_offline(open_page, tmp_path):
    obj = viz.head_view(encoder_attention=_attentions(1), decoder_attention=_attentions(2, True),
                        encoder_tokens=TOKENS, decoder_tokens=list("abcde"), html_action="return")
    page, watch = _open(open_page, tmp_path, obj)
    frames = page.frames[1:]
    assert len(frames) == 2
    for f in frames:
        f.wait_for_selector("#drawing .link", state="attached")
    assert "[CLS]" in frames[0].text_content("#drawing")
    assert watch.errors == [] and watch.outside() == [] and watch.dialogs == []
