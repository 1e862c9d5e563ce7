"""bertviz's head_view / model_view on any model's attentions: the page carries exactly the
model's weights and tokens, the arguments mean what bertviz documents, and bad input is named."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
import torch

import attnlab.viz as viz
from attnlab.capture import ModelAttention
from attnlab.errors import AttnlabError
from attnlab.viz import notebook_views
from viz.fakes import XSS, fake_capture

TOKENS = ["[CLS]", "the", "cat", "sat", "[SEP]", "it", "slept", "[SEP]"]


def _payload(doc: str) -> dict:
    m = re.search(r'<script type="application/json" id="attn-data">(.*?)</script>', doc, re.S)
    return json.loads(m.group(1))


def _weights(p: dict) -> np.ndarray:
    w = np.frombuffer(base64.b64decode(p["weights"]), dtype="<f4")
    return w.reshape(p["n_layers"], p["n_heads"], p["L"], p["S"])


def _opening(doc: str) -> str:
    return re.search(r'data-open="([^"]*)"', doc).group(1)


def _bert(n):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3,
                                 num_attention_heads=4, intermediate_size=64,
                                 attn_implementation="eager")).eval()
    with torch.no_grad():
        return model(torch.randint(5, 50, (2, n)), output_attentions=True).attentions


def test_bert_page_carries_the_models_weights_and_tokens():
    att = _bert(len(TOKENS))
    page = viz.head_view(att, TOKENS, html_action="return")
    p = _payload(page.data)
    assert p["tokens"] == TOKENS and p["causal"] is False and p["queries"] is None
    want = torch.stack([a[0] for a in att]).numpy()  # batch 0: (layers, H, L, S)
    np.testing.assert_allclose(_weights(p), want, atol=1e-6)
    assert "view=head" in _opening(page.data)
    assert "view=model" in _opening(viz.model_view(att, TOKENS, html_action="return").data)


def test_gpt2_is_causal_and_prettified():
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    model = GPT2Model(GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                                 attn_implementation="eager")).eval()
    with torch.no_grad():
        att = model(torch.randint(0, 50, (1, 4)), output_attentions=True).attentions
    p = _payload(viz.model_view(att, ["The", "Ġcat", "Ġsat", "."], html_action="return").data)
    assert p["tokens"] == ["The", " cat", " sat", "."] and p["causal"] is True
    np.testing.assert_allclose(_weights(p), torch.stack([a[0] for a in att]).numpy(), atol=1e-6)
    raw = viz.head_view(att, ["The", "Ġcat", "Ġsat", "."], prettify_tokens=False,
                        html_action="return")
    assert _payload(raw.data)["tokens"] == ["The", "Ġcat", "Ġsat", "."]


def _t5():
    from transformers import T5Config, T5Model

    torch.manual_seed(0)
    model = T5Model(T5Config(vocab_size=60, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                             num_heads=4, relative_attention_num_buckets=8, dropout_rate=0.0,
                             attn_implementation="eager")).eval()
    with torch.no_grad():
        return model(input_ids=torch.randint(1, 60, (1, 5)),
                     decoder_input_ids=torch.randint(1, 60, (1, 3)), output_attentions=True)


def test_t5_encoder_decoder_and_cross_in_one_page():
    out = _t5()
    enc, dec = [f"e{i}" for i in range(5)], [f"d{i}" for i in range(3)]
    page = viz.head_view(encoder_attention=out.encoder_attentions,
                         decoder_attention=out.decoder_attentions,
                         cross_attention=out.cross_attentions, encoder_tokens=enc,
                         decoder_tokens=dec, html_action="return")
    doc = _payload(page.data)
    assert [c["name"] for c in doc["choices"]] == ["Encoder", "Decoder", "Cross"]
    p_enc, p_dec, p_cross = doc["sets"]
    assert p_enc["tokens"] == enc and p_enc["key_tokens"] is None
    assert p_dec["tokens"] == dec and p_dec["causal"] is True
    # cross: decoder tokens query (rows), encoder tokens are the keys (columns)
    assert p_cross["tokens"] == dec and p_cross["key_tokens"] == enc
    assert (p_cross["L"], p_cross["S"], p_cross["causal"]) == (3, 5, False)
    for p, att in ((p_enc, out.encoder_attentions), (p_dec, out.decoder_attentions),
                   (p_cross, out.cross_attentions)):
        np.testing.assert_allclose(_weights(p), torch.stack([a[0] for a in att]), atol=1e-6)
    bad = [a * 2 for a in out.cross_attentions]
    with pytest.raises(AttnlabError, match=r"^cross_attention: expected each row to sum to 1"):
        viz.head_view(encoder_attention=out.encoder_attentions, encoder_tokens=enc,
                      decoder_tokens=dec, cross_attention=bad, html_action="return")
    with pytest.raises(AttnlabError, match=r"^decoder_tokens: expected 3"):
        viz.head_view(cross_attention=out.cross_attentions, encoder_tokens=enc,
                      decoder_tokens=dec[:2], html_action="return")
    with pytest.raises(AttnlabError, match=r"^encoder_tokens: expected 5"):
        viz.head_view(cross_attention=out.cross_attentions, encoder_tokens=enc[:4],
                      decoder_tokens=dec, html_action="return")
    with pytest.raises(AttnlabError, match=r"^encoder_tokens: expected the tokens"):
        viz.head_view(encoder_attention=out.encoder_attentions, html_action="return")
    with pytest.raises(AttnlabError, match=r"^decoder_tokens: expected the decoder's tokens"):
        viz.head_view(cross_attention=out.cross_attentions, encoder_tokens=enc,
                      html_action="return")
    with pytest.raises(AttnlabError, match=r"^cross_attention: expected None with `attention`"):
        viz.head_view(out.encoder_attentions, enc, cross_attention=out.cross_attentions,
                      html_action="return")


def test_include_layers_and_heads_keep_those_labelled_with_the_models_numbers():
    att = _bert(len(TOKENS))
    page = viz.model_view(att, TOKENS, include_layers=[2, 0], include_heads=[3, 1],
                          html_action="return")
    p = _payload(page.data)
    assert (p["n_layers"], p["n_heads"]) == (2, 2)
    assert p["layer_ids"] == [2, 0] and p["head_ids"] == [3, 1]
    np.testing.assert_allclose(_weights(p)[0], att[2][0][[3, 1]].numpy(), atol=1e-6)
    np.testing.assert_allclose(_weights(p)[1], att[0][0][[3, 1]].numpy(), atol=1e-6)
    assert len(p["head_stats"]["labels"][0]) == 2
    # bertviz's `layer` is the model's layer number, one of include_layers
    page = viz.head_view(att, TOKENS, layer=0, include_layers=[2, 0], html_action="return")
    assert "layer=1" in _opening(page.data)
    with pytest.raises(AttnlabError, match=r"^layer: expected one of include_layers \[2, 0\]"):
        viz.head_view(att, TOKENS, layer=1, include_layers=[2, 0], html_action="return")
    with pytest.raises(AttnlabError, match=r"^include_heads: expected 0..3"):
        viz.model_view(att, TOKENS, include_heads=[4], html_action="return")
    with pytest.raises(AttnlabError, match=r"^include_layers"):
        viz.model_view(att, TOKENS, include_layers=[3], html_action="return")


def test_sentence_b_start_adds_bertvizs_filter():
    att = _bert(len(TOKENS))
    page = viz.head_view(att, TOKENS, layer=1, heads=[2], sentence_b_start=5,
                         html_action="return")
    assert _opening(page.data) == "view=head&amp;layer=1&amp;head=2&amp;heads=2&amp;token=5"
    doc = _payload(page.data)
    np.testing.assert_allclose(_weights(doc["sets"][0]), torch.stack([a[0] for a in att]),
                               atol=1e-6)  # one copy of the weights: the filter is a block
    got = [(c["name"], c.get("rows"), c.get("cols")) for c in doc["choices"]]
    assert got == [("All", None, None),
                   ("Sentence A → Sentence A", [0, 5], [0, 5]),
                   ("Sentence B → Sentence B", [5, 8], [5, 8]),
                   ("Sentence A → Sentence B", [0, 5], [5, 8]),
                   ("Sentence B → Sentence A", [5, 8], [0, 5])]
    with pytest.raises(AttnlabError, match=r"^sentence_b_start: expected 1..7"):
        viz.head_view(att, TOKENS, sentence_b_start=8, html_action="return")


def test_heads_are_the_heads_drawn_first():
    torch.manual_seed(0)
    att = tuple(torch.randn(2, 1, 4, 3, 3).softmax(-1))  # (layers, batch, H, L, S)
    toks = ["a", "b", "c"]
    opening = lambda **kw: _opening(viz.head_view(att, toks, html_action="return", **kw).data)  # noqa: E731
    # nothing chosen: the page opens where its data says (the top head for one word, pinned)
    assert opening() == "view=head"
    assert '"opening":{"layer":' in viz.head_view(att, toks, html_action="return").data
    assert opening(heads=[]) == "view=head"
    assert opening(layer=1) == "view=head&amp;layer=1&amp;heads=all"  # bertviz: every head
    assert opening(heads=[3, 1]) == "view=head&amp;head=3&amp;heads=3,1"
    assert opening(heads=torch.tensor([-1])) == "view=head&amp;head=3&amp;heads=3"
    assert "heads" not in _opening(viz.model_view(att, toks, html_action="return").data)
    with pytest.raises(AttnlabError, match=r"^heads: expected 0..3"):
        opening(heads=[1, 4])
    with pytest.raises(AttnlabError, match=r"^heads: expected a list"):
        opening(heads=2)


def test_display_mode_colours_the_page():
    att = _bert(len(TOKENS))
    theme = lambda page: re.search(r'<body[^>]*data-theme="(\w+)"', page.data).group(1)  # noqa: E731
    assert theme(viz.model_view(att, TOKENS, html_action="return")) == "dark"  # bertviz's default
    assert theme(viz.model_view(att, TOKENS, display_mode="light", html_action="return")) == "light"
    assert theme(viz.head_view(att, TOKENS, html_action="return")) == "light"
    with pytest.raises(AttnlabError, match=r"^display_mode"):
        viz.model_view(att, TOKENS, display_mode="blue", html_action="return")


def test_model_attention_in_step_view_and_save(tmp_path):
    ma = fake_capture(["a", XSS, "c"])
    page = viz.head_view(ma, html_action="return")
    assert _payload(page.data)["queries"] is not None  # q/k travel: the step view has its steps
    assert XSS not in page.data
    path = viz.save(page, tmp_path / "p.html")
    assert path.read_text(encoding="utf-8") == page.data
    assert "srcdoc" in page._repr_html_() and XSS not in page._repr_html_()
    with pytest.raises(AttnlabError, match=r"^obj"):
        viz.save("nope", tmp_path / "q.html")


@pytest.mark.parametrize("make, match", [
    (lambda a: [a[0], a[1][:, :, :-1]], r"^attention: layers differ in shape"),
    (lambda a: [x * 1.5 for x in a], r"^attention: expected each row to sum to 1"),
    (lambda a: [x - 0.5 for x in a], r"^attention: expected probabilities"),
    (lambda a: [x[0] for x in a], r"^attention\[0\]: expected \(batch, heads, L, S\)"),
    (lambda a: [], r"^attention: expected a non-empty"),
])
def test_bad_attentions_are_named(make, match):
    att = list(_bert(len(TOKENS)))
    with pytest.raises(AttnlabError, match=match):
        viz.head_view(make(att), TOKENS, html_action="return")


def test_bad_tokens_and_action_are_named():
    att = _bert(len(TOKENS))
    with pytest.raises(AttnlabError, match=r"^tokens: expected 8"):
        viz.head_view(att, TOKENS[:-1], html_action="return")
    with pytest.raises(AttnlabError, match=r"^html_action"):
        viz.head_view(att, TOKENS, html_action="show")
    with pytest.raises(AttnlabError, match=r"^layer: expected 0..2"):
        viz.head_view(att, TOKENS, layer=3, html_action="return")


def test_from_attentions_builds_a_weights_only_capture():
    att = _bert(len(TOKENS))
    ma = ModelAttention.from_attentions(att, TOKENS, model_name="bert-tiny")
    assert (ma.n_layers, ma.n_heads) == (3, 4) and ma.queries is None and ma.mask.all()
    np.testing.assert_allclose(ma.weights, torch.stack([a[0] for a in att]).double().numpy())
    causal = [torch.tril(torch.ones(1, 2, 3, 3)) / torch.arange(1, 4).view(3, 1)]
    ma = ModelAttention.from_attentions(causal, ["a", "b", "c"])
    assert ma.causal and (ma.mask == np.tril(np.ones((3, 3), dtype=bool))).all()
    with pytest.raises(AttnlabError, match=r"^attentions: expected self-attention"):
        ModelAttention.from_attentions([torch.full((1, 1, 2, 4), 0.25)], list("abcd"))
    with pytest.raises(AttnlabError, match=r"^attentions: expected a non-empty"):
        ModelAttention.from_attentions(torch.ones(1, 1, 2, 2), ["a", "b"])


def test_negative_indices_are_pythons_and_documented():
    att = tuple(torch.rand(3, 1, 4, 3, 3).softmax(-1))  # (layers, batch, H, L, S)
    page = viz.head_view(att, ["a", "b", "c"], heads=[-1], include_layers=[-1],
                         html_action="return")
    assert _opening(page.data) == "view=head&amp;head=3&amp;heads=3"
    assert _payload(page.data)["layer_ids"] == [2]
    assert "-1 is the last head or layer" in notebook_views.__doc__


def test_a_page_too_large_is_refused_with_how_to_narrow_it():
    n = 2100  # 4 heads x 2100 x 2100 weights, the rollout, the mask: 123 MB
    att = (torch.rand(1, 4, n, n).softmax(-1),)  # (batch, H, L, S) per layer
    tokens = [f"t{i}" for i in range(n)]
    with pytest.raises(AttnlabError, match=r"^attention: 1 layers x 4 heads x 2100 x 2100 tokens "
                       r"make a 123 MB page, above 64 MB; narrow it with include_layers=\[...\], "
                       r"include_heads=\[...\] or fewer tokens"):
        viz.model_view(att, tokens, html_action="return")
    with pytest.raises(AttnlabError, match=r"narrow it with include_layers=\[...\] or fewer"):
        viz.head_view(att, tokens, html_action="return")
    small = viz.model_view(att, tokens, include_heads=[0], html_action="return")
    mb = notebook_views.page_mb(notebook_views._capture(att, tokens, "attention", True))
    assert 122 < mb < 124
    assert 0.95 < len(small.data) / 53e6 < 1.05  # one head: 53 MB, as estimated
