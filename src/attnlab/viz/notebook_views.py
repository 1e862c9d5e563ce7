"""bertviz's calls on attnlab's page: `head_view` / `model_view` of the attentions any model
returns (`output_attentions=True`) or of a ModelAttention, and `save`; and `lesson_view`, the
explorable lesson for Jupyter.

Same arguments and meaning as bertviz's functions of those names; what opens is attnlab's
self-contained, offline page (head, model, step and heads views). Weights alone give every view
but the step view's q·k steps, which need queries and keys (a model run through attnlab); the step
view says so. As in bertviz, the page's "attention" list chooses between an encoder-decoder
model's encoder, decoder and cross attention (decoder tokens query, encoder tokens are the keys),
or, with `sentence_b_start`, narrows the drawing to "Sentence A → Sentence B" and the like.
`include_layers` / `include_heads` keep those layers and heads (labelled with the model's
numbers); `display_mode` "dark" or "light" colours the page. Indices (`layer`, `heads`,
`include_layers`, `include_heads`) are Python's: -1 is the last head or layer.
Caution: a page carries every number it draws (about 5.3 bytes each): one above
MAX_PAGE_MB is refused with its size and how to narrow it (`include_layers`, `include_heads`,
fewer tokens); a 3,000-token text is 48 MB per head.
Exported as `attnlab.viz.head_view` etc.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from attnlab.capture import ModelAttention
from attnlab.errors import AttnlabError
from attnlab.viz.checks import check_index
from attnlab.viz.iframe import NotebookPage, ViewPage
from attnlab.viz.lesson_page import LessonPage
from attnlab.viz.page import page_html
from attnlab.viz.payload import document, payload

#: the largest page head_view / model_view write (a browser slows down well before)
MAX_PAGE_MB = 64
_PRETTY = {"Ġ": " ", "▁": " ", "Ċ": "\\n", "</w>": ""}


class AttentionPage(ViewPage):
    """What `html_action="return"` gives: `.data` is the page's HTML (self-contained, offline),
    `.save(path)` writes it. In Jupyter it shows in a sandboxed iframe."""

    def __init__(self, data: str, height: int = 640):
        super().__init__(data, height)


def _prettify(tokens) -> list[str]:
    out = []
    for t in tokens:
        t = str(t)
        for old, new in _PRETTY.items():
            t = t.replace(old, new)
        out.append(t)
    return out


def _capture(attention, tokens, name: str, prettify: bool, query_tokens=None,
             tokens_name: str = "tokens", query_name: str = ""):
    """`attention` (per-layer tensors or a ModelAttention) as a ModelAttention; with
    `query_tokens`, a cross-attention (queries from another text than the keys). Errors name
    the caller's arguments (`tokens_name`, `query_name`)."""
    if isinstance(attention, ModelAttention):
        if tokens is not None and [str(t) for t in tokens] != attention.tokens:
            raise AttnlabError(f"{tokens_name}: expected the capture's {len(attention.tokens)} "
                               f"tokens or None, got {len(tokens)} different ones")
        return attention
    if tokens is None:
        raise AttnlabError(f"{tokens_name}: expected the tokens {name} attends over, got None")
    tidy = _prettify if prettify else (lambda ts: [str(t) for t in ts])
    try:
        return ModelAttention.from_attentions(
            attention, tidy(tokens), name=name,
            query_tokens=None if query_tokens is None else tidy(query_tokens))
    except AttnlabError as e:  # from_attentions names its own arguments
        msg = str(e)
        for own, caller in (("tokens:", tokens_name), ("query_tokens:", query_name)):
            if msg.startswith(own):
                msg = f"{caller}:{msg[len(own):]}"
        raise AttnlabError(msg) from None


def _positions(name: str, ids, n: int, what: str) -> list[int] | None:
    """bertviz's include_layers / include_heads as indices into `n` things (None: all)."""
    if ids is None:
        return None
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise AttnlabError(f"{name}: expected a list of indices, got {ids!r}")
    picked = [check_index(name, x, n, what) for x in ids]
    if not picked:
        raise AttnlabError(f"{name}: expected at least one index, got []")
    return picked


def _none_if_empty(ids):
    """bertviz's `heads`: an empty list, like None, shows every head."""
    if hasattr(ids, "__len__") and not isinstance(ids, (str, bytes)) and len(ids) == 0:
        return None
    return ids


def _select(ma, layers: list[int] | None, heads: list[int] | None):
    """The capture narrowed to those layers and heads, in that order."""
    if layers is None and heads is None:
        return ma
    layers = list(range(ma.n_layers)) if layers is None else layers
    heads = list(range(ma.n_heads)) if heads is None else heads

    def per_head(a):  # (layers, H, ...) -> the picked layers and heads
        return None if a is None else np.asarray(a)[layers][:, heads]

    return replace(ma, weights=per_head(ma.weights), queries=per_head(ma.queries),
                   keys=per_head(ma.keys), values=per_head(ma.values), bias=per_head(ma.bias),
                   layer_masks=None if ma.layer_masks is None else ma.layer_masks[layers],
                   softcap=None if ma.softcap is None else [ma.softcap[i] for i in layers])


def page_mb(ma) -> float:
    """The size of `ma`'s numbers on a page, in MB: weights, rollout, q/k/v and bias as base64
    float32 (16/3 bytes a number), masks as base64 bytes."""
    layers, H, L, S = np.shape(ma.weights)
    numbers = layers * H * L * S + (L * S if L == S else 0)
    for a in (ma.queries, ma.keys, ma.values, ma.bias):
        numbers += 0 if a is None else int(np.prod(np.shape(a)))
    masks = L * S * (1 + (0 if ma.layer_masks is None else layers))
    return (numbers * 16 / 3 + masks * 4 / 3) / 1e6


def _check_size(ma, name: str, view: str) -> None:
    mb = page_mb(ma)
    if mb > MAX_PAGE_MB:
        layers, H, L, S = np.shape(ma.weights)
        what = f"{name.lower()}_attention" if name else "attention"
        narrow = "include_layers=[...]" + (", include_heads=[...]" if view == "model" else "")
        raise AttnlabError(
            f"{what}: {layers} layers x {H} heads x {L} x {S} tokens make a {mb:.0f} MB page, "
            f"above {MAX_PAGE_MB} MB; narrow it with {narrow} or fewer tokens (slice the "
            f"attentions' last two dims and the tokens to a range)")


def _sentence_choices(n: int, b) -> list[dict]:
    """bertviz's sentence-pair filter: all tokens, or sentence A / B queries to A / B keys."""
    if isinstance(b, bool) or not isinstance(b, int) or not 0 < b < n:
        raise AttnlabError(f"sentence_b_start: expected 1..{n - 1} (the index of sentence "
                           f"B's first token of {n}), got {b!r}")
    a_, b_ = [0, b], [b, n]
    return [{"name": "All", "set": 0},
            {"name": "Sentence A \u2192 Sentence A", "set": 0, "rows": a_, "cols": a_},
            {"name": "Sentence B \u2192 Sentence B", "set": 0, "rows": b_, "cols": b_},
            {"name": "Sentence A \u2192 Sentence B", "set": 0, "rows": a_, "cols": b_},
            {"name": "Sentence B \u2192 Sentence A", "set": 0, "rows": b_, "cols": a_}]


def _parts(attention, tokens, prettify, encoder_attention, decoder_attention, cross_attention,
           encoder_tokens, decoder_tokens) -> list[tuple[str, object]]:
    """(name, capture) of each attention the call passed: one, or encoder / decoder / cross."""
    if attention is not None:
        for arg, value in (("encoder_attention", encoder_attention),
                           ("decoder_attention", decoder_attention),
                           ("cross_attention", cross_attention),
                           ("encoder_tokens", encoder_tokens), ("decoder_tokens", decoder_tokens)):
            if value is not None:
                raise AttnlabError(f"{arg}: expected None with `attention` (a self-attention "
                                   f"model's); pass encoder-decoder attentions without it")
        return [("", _capture(attention, tokens, "attention", prettify))]
    if encoder_attention is None and decoder_attention is None and cross_attention is None:
        raise AttnlabError("attention: expected per-layer attentions (or encoder_attention / "
                           "decoder_attention / cross_attention), got None")
    parts = []
    if encoder_attention is not None:
        parts.append(("Encoder", _capture(encoder_attention, encoder_tokens,
                                          "encoder_attention", prettify,
                                          tokens_name="encoder_tokens")))
    if decoder_attention is not None:
        parts.append(("Decoder", _capture(decoder_attention, decoder_tokens,
                                          "decoder_attention", prettify,
                                          tokens_name="decoder_tokens")))
    if cross_attention is not None:
        if decoder_tokens is None and not hasattr(cross_attention, "query_tokens"):
            raise AttnlabError("decoder_tokens: expected the decoder's tokens (the queries of "
                               "cross_attention), got None")
        parts.append(("Cross", _capture(cross_attention, encoder_tokens, "cross_attention",
                                        prettify, query_tokens=decoder_tokens,
                                        tokens_name="encoder_tokens",
                                        query_name="decoder_tokens")))
    return parts


def _show(view: str, attention, tokens, sentence_b_start, prettify_tokens, layer, heads,
          encoder_attention, decoder_attention, cross_attention, encoder_tokens, decoder_tokens,
          include_layers, include_heads, html_action, theme):
    if html_action not in ("view", "return"):
        raise AttnlabError(f'html_action: expected "view" or "return", got {html_action!r}')
    parts = _parts(attention, tokens, prettify_tokens, encoder_attention, decoder_attention,
                   cross_attention, encoder_tokens, decoder_tokens)
    opening: dict[str, int | str] = {"view": view}
    sets = []
    for name, ma in parts:
        lids = _positions("include_layers", include_layers, ma.n_layers, "layers")
        hids = _positions("include_heads", include_heads, ma.n_heads, "heads")
        ma = _select(ma, lids, hids)
        _check_size(ma, name, view)
        if layer is not None and "layer" not in opening:
            opening["layer"] = _opening_index("layer", layer, lids, ma.n_layers, "layers")
        chose = layer is not None or _none_if_empty(heads) is not None
        # nothing chosen: the page opens on the head explain ranks first for "it" (or the first
        # word), pinned; else bertviz's: the heads shown (None: all)
        if view == "head" and "heads" not in opening and chose:
            picked = _positions("heads", _none_if_empty(heads), ma.n_heads, "heads")
            if picked:
                opening["head"] = picked[0]
            opening["heads"] = ",".join(map(str, picked)) if picked else "all"
        sets.append((name, payload(ma, layer_ids=lids, head_ids=hids)))
    choices = None
    if sentence_b_start is not None and attention is not None:
        choices = _sentence_choices(sets[0][1]["L"], sentence_b_start)
        opening["token"] = sentence_b_start
    data = sets[0][1] if len(sets) == 1 and choices is None else document(sets, choices)
    out = AttentionPage(page_html(data=data, opening=opening, theme=theme))
    if html_action == "return":
        return out
    if not _in_notebook():  # a plain script or a terminal: nothing could show the page
        warnings.warn(f"{view}_view: no notebook to show the page in; save it with "
                      f"attnlab.viz.save({view}_view(..., html_action=\"return\"), "
                      f"\"view.html\") and open that file (the page is returned as well)",
                      stacklevel=3)
        return out
    from IPython.display import HTML, display  # Jupyter's own: only "view" needs it

    display(HTML(out._repr_html_()))
    return None


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (it can display HTML); False in a script or terminal IPython."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and type(shell).__name__ != "TerminalInteractiveShell"


def _opening_index(name: str, value, ids: list[int] | None, n: int, what: str) -> int:
    """bertviz's `layer` is the model's layer number; with include_layers it must be one of them."""
    if ids is None:
        return check_index(name, value, n, what)
    if isinstance(value, bool) or value not in ids:
        raise AttnlabError(f"{name}: expected one of include_layers {ids}, got {value!r}")
    return ids.index(value)


def head_view(attention=None, tokens=None, sentence_b_start=None, prettify_tokens=True,
              layer=None, heads=None, encoder_attention=None, decoder_attention=None,
              cross_attention=None, encoder_tokens=None, decoder_tokens=None,
              include_layers=None, html_action="view"):
    """bertviz's `head_view` on attnlab's page: one layer's heads overlaid, query tokens to key
    tokens.

    `attention` is the per-layer tuple of (batch, heads, L, S) tensors from
    `output_attentions=True` (batch 0 is shown) or a ModelAttention; `tokens` the L tokens.
    Encoder-decoder models pass `encoder_attention` / `decoder_attention` / `cross_attention`
    (decoder x encoder tokens) and `encoder_tokens` / `decoder_tokens`: the page's "attention"
    list chooses Encoder, Decoder or Cross. `layer` (the model's layer number, one of
    `include_layers` when given) is the layer that opens; `heads` the heads drawn at once, each
    in its colour (None: every head; a click on a head's square shows or hides it, a
    double-click shows it alone), the first one giving the numbers; `include_layers` keeps those
    layers; `sentence_b_start` (where sentence B begins) adds bertviz's filter: All,
    Sentence A → Sentence A, B → B, A → B, B → A. `html_action="view"` shows it in the notebook,
    `"return"` returns an object whose `.data` is the page's HTML.
    """
    return _show("head", attention, tokens, sentence_b_start, prettify_tokens, layer, heads,
                 encoder_attention, decoder_attention, cross_attention, encoder_tokens,
                 decoder_tokens, include_layers, None, html_action, "light")


def model_view(attention=None, tokens=None, sentence_b_start=None, prettify_tokens=True,
               display_mode="dark", encoder_attention=None, decoder_attention=None,
               cross_attention=None, encoder_tokens=None, decoder_tokens=None,
               include_layers=None, include_heads=None, html_action="view"):
    """bertviz's `model_view` on attnlab's page: every layer x head at once (arguments as in
    `head_view`). `include_heads` keeps those heads (and `include_layers` those layers), labelled
    with the model's numbers; `display_mode` "dark" (bertviz's default) or "light" colours the
    page."""
    if display_mode not in ("light", "dark"):
        raise AttnlabError(f'display_mode: expected "light" or "dark", got {display_mode!r}')
    return _show("model", attention, tokens, sentence_b_start, prettify_tokens, None, None,
                 encoder_attention, decoder_attention, cross_attention, encoder_tokens,
                 decoder_tokens, include_layers, include_heads, html_action, display_mode)


def lesson_view(height: int = 900) -> LessonPage:
    """The explorable lesson (drag the query, edit the numbers, every percentage live).

    Returns a `LessonPage`: Jupyter shows it in a sandboxed iframe `height` pixels tall;
    `.save("lesson.html")` writes the offline page, `.html` is its text.
    """
    if isinstance(height, bool) or not isinstance(height, int) or height < 100:
        raise AttnlabError(f"height: expected pixels as an int >= 100, got {height!r}")
    return LessonPage(height)


def save(obj, path) -> Path:
    """Write the page of `obj` (what `html_action="return"` gave, any page for Jupyter such as
    `lesson_view()`, or a ModelAttention) to `path`."""
    if isinstance(obj, NotebookPage):
        text = obj.data
    elif hasattr(obj, "weights") and hasattr(obj, "tokens"):
        text = page_html(obj)
    else:
        raise AttnlabError(f"obj: expected what head_view/model_view returned or a "
                           f"ModelAttention, got {type(obj).__name__}")
    path = Path(path)
    path.write_text(text, encoding="utf-8")
    return path
