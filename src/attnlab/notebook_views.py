"""bertviz's calls on attnlab's page: `head_view` / `model_view` of the attentions any model
returns (`output_attentions=True`) or of a ModelAttention, and `save`.

Same arguments and meaning as bertviz's functions of those names; what opens is attnlab's
self-contained, offline page (head, model, step and heads views). Weights alone give every view
but the step view's q·k steps, which need queries and keys (a model run through attnlab); the step
view says so. Encoder-decoder models show the encoder and the decoder self-attention, one page
each; cross-attention (queries and keys from two texts) is checked but not drawn.
Exported as `attnlab.viz.head_view` etc.; kept outside viz because it builds ModelAttention
(viz draws captures and never imports capture).
"""

from __future__ import annotations

import html
from pathlib import Path

from attnlab.errors import AttnlabError
from attnlab.viz.checks import check_index

_PRETTY = {"Ġ": " ", "▁": " ", "Ċ": "\\n", "</w>": ""}


class AttentionPage:
    """What `html_action="return"` gives: `.data` is the page's HTML (self-contained, offline).
    In Jupyter it shows in a sandboxed iframe."""

    def __init__(self, data: str, height: int = 640):
        self.data = data
        self.height = height

    def _repr_html_(self) -> str:
        doc = html.escape(self.data, quote=True)
        return (f'<iframe srcdoc="{doc}" sandbox="allow-scripts allow-downloads" '
                f'style="width:100%;height:{int(self.height)}px;border:1px solid #ddd" '
                f'title="attnlab: attention"></iframe>')


def _prettify(tokens) -> list[str]:
    out = []
    for t in tokens:
        t = str(t)
        for old, new in _PRETTY.items():
            t = t.replace(old, new)
        out.append(t)
    return out


def _capture(attention, tokens, name: str, prettify: bool, include_layers, sentence_b_start):
    """`attention` (per-layer tensors or a ModelAttention) as a ModelAttention."""
    from attnlab.capture import ModelAttention

    if isinstance(attention, ModelAttention):
        ma = attention
        if tokens is not None and [str(t) for t in tokens] != ma.tokens:
            raise AttnlabError(f"tokens: expected the capture's {len(ma.tokens)} tokens or None, "
                               f"got {len(tokens)} different ones")
        if include_layers is not None:
            picked = [check_index("include_layers", x, ma.n_layers, "layers")
                      for x in include_layers]
            if not picked:
                raise AttnlabError("include_layers: expected at least one layer, got []")
            ma = _layers(ma, picked)
    else:
        if tokens is None:
            raise AttnlabError(f"tokens: expected the tokens {name} attends over, got None")
        tokens = _prettify(tokens) if prettify else [str(t) for t in tokens]
        ma = ModelAttention.from_attentions(attention, tokens, include_layers=include_layers,
                                            name=name)
    if sentence_b_start is not None:
        n = len(ma.tokens)
        if isinstance(sentence_b_start, bool) or not isinstance(sentence_b_start, int) \
                or not 0 < sentence_b_start < n:
            raise AttnlabError(f"sentence_b_start: expected 1..{n - 1} (the index of sentence "
                               f"B's first token of {n}), got {sentence_b_start!r}")
    return ma


def _layers(ma, picked: list[int]):
    from dataclasses import replace

    sub = lambda a: None if a is None else a[picked]  # noqa: E731
    return replace(ma, weights=ma.weights[picked], queries=sub(ma.queries), keys=sub(ma.keys),
                   values=sub(ma.values), bias=sub(ma.bias),
                   layer_masks=sub(ma.layer_masks),
                   softcap=None if ma.softcap is None else [ma.softcap[i] for i in picked])


def _show(view: str, attention, tokens, sentence_b_start, prettify_tokens, layer, heads,
          encoder_attention, decoder_attention, cross_attention, encoder_tokens, decoder_tokens,
          include_layers, html_action):
    if html_action not in ("view", "return"):
        raise AttnlabError(f'html_action: expected "view" or "return", got {html_action!r}')
    parts = []  # (heading, capture)
    if attention is not None:
        parts.append(("", _capture(attention, tokens, "attention", prettify_tokens,
                                   include_layers, sentence_b_start)))
    elif encoder_attention is None and decoder_attention is None:
        raise AttnlabError("attention: expected per-layer attentions (or encoder_attention / "
                           "decoder_attention), got None")
    else:
        if encoder_attention is not None:
            parts.append(("Encoder", _capture(encoder_attention, encoder_tokens,
                                              "encoder_attention", prettify_tokens,
                                              include_layers, None)))
        if decoder_attention is not None:
            parts.append(("Decoder", _capture(decoder_attention, decoder_tokens,
                                              "decoder_attention", prettify_tokens,
                                              include_layers, None)))
        if cross_attention is not None:
            _check_cross(cross_attention, parts)
    pages = [_page(ma, view, layer, heads, sentence_b_start if not h else None) for h, ma in parts]
    if len(pages) == 1:
        out = AttentionPage(pages[0])
    else:
        out = AttentionPage(_stack([(h, p) for (h, _), p in zip(parts, pages)]), height=1300)
    if html_action == "return":
        return out
    from IPython.display import HTML, display  # Jupyter's own: only "view" needs it

    display(HTML(out._repr_html_()))
    return None


def _page(ma, view: str, layer, heads, sentence_b_start) -> str:
    from attnlab.viz.page import page_html

    opening: dict[str, int | str] = {"view": view}
    if layer is not None:
        opening["layer"] = check_index("layer", layer, ma.n_layers, "layers")
    if heads is not None:
        picked = [check_index("heads", h, ma.n_heads, "heads") for h in heads]
        if picked:
            opening["head"] = picked[0]
    if sentence_b_start is not None:
        opening["token"] = sentence_b_start
    return page_html(ma, opening=opening)


def _check_cross(cross_attention, parts) -> None:
    """Cross-attention is validated (a probability distribution over the encoder's tokens)."""
    import numpy as np

    from attnlab.capture import _numpy

    if not isinstance(cross_attention, (list, tuple)) or not cross_attention:
        raise AttnlabError("cross_attention: expected a non-empty tuple or list of per-layer "
                           f"(batch, heads, L, S) tensors, got {type(cross_attention).__name__}")
    for i, a in enumerate(cross_attention):
        a = _numpy(a)
        if a.ndim != 4 or not np.isfinite(a).all() or a.min() < -1e-6 \
                or not np.allclose(a.sum(-1), 1.0, atol=1e-3):
            raise AttnlabError(f"cross_attention[{i}]: expected (batch, heads, L, S) softmax "
                               f"weights over the encoder's tokens, got shape {a.shape}")


def _stack(pages: list[tuple[str, str]]) -> str:
    """Several pages in one document, one sandboxed iframe each (no script in the wrapper)."""
    body = "".join(
        f"<h2>{html.escape(h)} attention</h2>"
        f'<iframe srcdoc="{html.escape(p, quote=True)}" sandbox="allow-scripts allow-downloads" '
        f'style="width:100%;height:620px;border:1px solid #ddd" '
        f'title="attnlab: {html.escape(h)} attention"></iframe>' for h, p in pages)
    from attnlab.viz.page import csp

    # a srcdoc frame inherits this policy: the pages' own (their script's hash, no requests)
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{html.escape(csp())}">'
            f"<title>attnlab</title></head><body>{body}</body></html>")


def head_view(attention=None, tokens=None, sentence_b_start=None, prettify_tokens=True,
              layer=None, heads=None, encoder_attention=None, decoder_attention=None,
              cross_attention=None, encoder_tokens=None, decoder_tokens=None,
              include_layers=None, html_action="view"):
    """bertviz's `head_view` on attnlab's page: one layer's heads, query tokens to key tokens.

    `attention` is the per-layer tuple of (batch, heads, L, S) tensors from
    `output_attentions=True` (batch 0 is shown) or a ModelAttention; `tokens` the L tokens.
    Encoder-decoder models pass `encoder_attention` / `decoder_attention` (and their tokens).
    `layer` and `heads` choose what opens; `include_layers` keeps those layers; `sentence_b_start`
    is where sentence B begins (the page opens on its first token). `html_action="view"` shows it
    in the notebook, `"return"` returns an object whose `.data` is the page's HTML.
    """
    return _show("head", attention, tokens, sentence_b_start, prettify_tokens, layer, heads,
                 encoder_attention, decoder_attention, cross_attention, encoder_tokens,
                 decoder_tokens, include_layers, html_action)


def model_view(attention=None, tokens=None, sentence_b_start=None, prettify_tokens=True,
               display_mode="light", encoder_attention=None, decoder_attention=None,
               cross_attention=None, encoder_tokens=None, decoder_tokens=None,
               include_layers=None, include_heads=None, html_action="view"):
    """bertviz's `model_view` on attnlab's page: every layer x head at once (arguments as in
    `head_view`; `include_heads` chooses the head that opens, `display_mode` is accepted)."""
    if display_mode not in ("light", "dark"):
        raise AttnlabError(f'display_mode: expected "light" or "dark", got {display_mode!r}')
    return _show("model", attention, tokens, sentence_b_start, prettify_tokens, None,
                 include_heads, encoder_attention, decoder_attention, cross_attention,
                 encoder_tokens, decoder_tokens, include_layers, html_action)


def save(obj, path) -> Path:
    """Write the page of `obj` (what `html_action="return"` gave, or a ModelAttention) to `path`."""
    if isinstance(obj, AttentionPage):
        text = obj.data
    elif hasattr(obj, "weights") and hasattr(obj, "tokens"):
        from attnlab.viz.page import page_html

        text = page_html(obj)
    else:
        raise AttnlabError(f"obj: expected what head_view/model_view returned or a "
                           f"ModelAttention, got {type(obj).__name__}")
    path = Path(path)
    path.write_text(text, encoding="utf-8")
    return path
