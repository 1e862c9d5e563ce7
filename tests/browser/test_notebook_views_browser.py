"""What head_view / model_view return, in headless Chromium: the page loads on the asked view and
layer with no network request; the "attention" list draws an encoder-decoder model's cross
attention (decoder tokens left, encoder tokens right) and bertviz's sentence-pair blocks;
include_heads / include_layers keep only those thumbnails; display_mode colours the page."""

from __future__ import annotations

import torch

import attnlab.viz as viz
from browser.helpers_browser import lines, texts

TOKENS = ["[CLS]", "the", "cat", "sat", "[SEP]"]


def _attentions(seed=0, causal=False, L=5, S=5, heads=2):
    torch.manual_seed(seed)
    s = torch.randn(3, 1, heads, L, S)  # (layers, batch, H, L, S)
    if causal:
        s = s.masked_fill(~torch.tril(torch.ones(L, S, dtype=torch.bool)), float("-inf"))
    return tuple(s.softmax(-1))


def _open(open_page, tmp_path, page_obj, name="view.html"):
    path = viz.save(page_obj, tmp_path / name)
    url = path.as_uri()
    page, watch = open_page(url, allowed=[url])
    return page, watch


def _clean(*watches):
    for w in watches:
        assert w.errors == [] and w.outside() == [] and w.dialogs == []


def test_returned_page_opens_on_the_asked_view_offline(open_page, tmp_path):
    att = _attentions()
    page, watch = _open(open_page, tmp_path, viz.model_view(att, TOKENS, html_action="return"))
    page.wait_for_selector("#drawing[data-view='model']", state="attached")
    assert page.is_hidden("#filter-label")  # one attention: no list to choose from
    page, watch2 = _open(open_page, tmp_path, viz.head_view(att, TOKENS, layer=2, heads=[1],
                                                             html_action="return"), "h.html")
    page.wait_for_selector("#drawing .link", state="attached")
    assert page.evaluate("[attnlabState.view, attnlabState.layer, attnlabState.head]") \
        == ["head", 2, 1]
    for i, j, opacity in lines(page):
        assert abs(opacity - float(att[2][0, 1, i, j])) < 1e-4
    page.click(".tab[data-view='step']")
    assert "weights only" in page.text_content("#drawing")
    _clean(watch, watch2)


def test_cross_attention_draws_decoder_tokens_to_encoder_tokens(open_page, tmp_path):
    cross = _attentions(3, L=3, S=5)
    dec = ["<pad>", "le", "chat"]
    obj = viz.head_view(encoder_attention=_attentions(1),
                        decoder_attention=_attentions(2, True, 3, 3), cross_attention=cross,
                        encoder_tokens=TOKENS, decoder_tokens=dec, layer=1, heads=[0],
                        html_action="return")
    page, watch = _open(open_page, tmp_path, obj)
    page.wait_for_selector("#drawing .link", state="attached")
    assert texts(page, "#filter option") == ["Encoder", "Decoder", "Cross"]
    page.select_option("#filter", "2")
    page.wait_for_selector("#drawing[data-choice='2']", state="attached")
    assert texts(page, "#drawing .queries .tok text") == dec
    assert texts(page, "#drawing .keys .tok text") == TOKENS
    drawn = {(i, j): w for i, j, w in lines(page)}
    want = {(i, j): float(cross[1][0, 0, i, j]) for i in range(3) for j in range(5)}
    assert drawn.keys() == {k for k, w in want.items() if w >= 0.002}
    assert max(abs(w - want[k]) for k, w in drawn.items()) < 1e-4
    page.hover(".tok.q[data-index='2']")
    assert texts(page, "#drawing .keys .pct") == [f"{100 * w:.1f}%" for w in cross[1][0, 0, 2]]
    page.click(".tab[data-view='step']")  # the keys of the step view are the encoder's tokens
    assert texts(page, "#drawing .step-row text")[::2] == TOKENS
    _clean(watch)


def test_sentence_filter_draws_only_that_block(open_page, tmp_path):
    toks = ["[CLS]", "the", "cat", "[SEP]", "it", "slept", "[SEP]"]
    att = _attentions(4, L=7, S=7)
    obj = viz.head_view(att, toks, sentence_b_start=4, heads=[0], html_action="return")
    page, watch = _open(open_page, tmp_path, obj)
    page.wait_for_selector("#drawing .link", state="attached")
    assert texts(page, "#filter option") == [
        "All", "Sentence A → Sentence A", "Sentence B → Sentence B", "Sentence A → Sentence B",
        "Sentence B → Sentence A"]
    assert len(lines(page)) == sum(float(w) >= 0.002 for w in att[0][0, 0].flatten())
    page.select_option("#filter", "3")  # Sentence A -> Sentence B
    page.wait_for_selector("#drawing[data-choice='3']", state="attached")
    assert texts(page, "#drawing .queries .tok text") == toks[:4]
    assert texts(page, "#drawing .keys .tok text") == toks[4:]
    drawn = {(i, j) for i, j, _ in lines(page)}
    w = att[0][0, 0]  # layer 0, head 0
    assert drawn == {(i, j) for i in range(4) for j in range(4, 7) if float(w[i, j]) >= 0.002}
    page.click(".tab[data-view='model']")  # thumbnails: 4 query rows x 3 key columns
    size = page.evaluate("""() => new Promise(ok => { const im = new Image();
        im.onload = () => ok([im.naturalWidth, im.naturalHeight]);
        im.src = document.querySelector('#drawing .thumb image').getAttribute('href'); })""")
    assert size == [3, 4]
    _clean(watch)


def test_include_heads_and_display_mode(open_page, tmp_path):
    att = _attentions(5, heads=4)
    dark = viz.model_view(att, TOKENS, include_layers=[2, 0], include_heads=[3, 1],
                          html_action="return")
    page, watch = _open(open_page, tmp_path, dark)
    page.wait_for_selector("#drawing .thumb", state="attached")
    titles = texts(page, "#drawing .thumb title")
    assert titles == ["layer 2, head 3", "layer 2, head 1", "layer 0, head 3", "layer 0, head 1"]
    assert texts(page, "#head option") == ["3", "1"] and texts(page, "#layer option") == ["2", "0"]
    colours = "[getComputedStyle(document.body).backgroundColor, " \
              "document.querySelector('#drawing .background').getAttribute('fill'), " \
              "[...document.querySelectorAll('#drawing text')].find(t => t.textContent === 'H3')" \
              ".getAttribute('fill')]"
    assert page.evaluate(colours) == ["rgb(0, 0, 0)", "#000", "#ccc"]
    light = viz.model_view(att, TOKENS, display_mode="light", html_action="return")
    page2, watch2 = _open(open_page, tmp_path, light, "light.html")
    page2.wait_for_selector("#drawing .thumb", state="attached")
    assert len(texts(page2, "#drawing .thumb title")) == 12
    assert page2.evaluate(colours) == ["rgb(246, 246, 244)", "#fff", "#222"]
    _clean(watch, watch2)
