"""What a view page shows for one capture, computed: `PagePayload` (the head, model, step and
heads views' numbers) and `page_payload(ma)`, which checks the capture once and computes the
head statistics and the attention rollout the page draws. `attnlab.viz.payload` writes the record
as the page's JSON; the step view recomputes softmax from q, k, v in the browser.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnlab.capture import ModelAttention, check_capture
from attnlab.errors import AttnlabError, fmt_shape
from attnlab.explain.attention_flow import rollout
from attnlab.explain.head_statistics import head_stats, looks_special, rules_text
from attnlab.explain.head_words import head_words
from attnlab.explain.token import find_word, focus_of, rank_heads

#: the word a page opens on when none is asked for and the text has it (the README's sentence)
OPENING_WORD = "it"


@dataclass
class PagePayload:
    """One capture's numbers for a page. weights (layers, H, L, S) with NaN as 0; mask (L, S)
    bool; queries (layers, H, L, D), keys and values (layers, H, S, D|Dv) or None (weights
    only); layer_masks (layers, L, S), softcap (one per layer) and bias (layers, H, L, S) or None
    (see `ModelAttention`); `tokens` are the L queries', `key_tokens` the S keys' when they
    differ (cross-attention); `layer_ids` / `head_ids` the model's numbers of the drawn layers
    and heads when they are a selection; `head_stats` {"stats", "labels", "rules"} and `rollout`
    (L, L) for a self-attention, else None. `opening` ({"layer", "head", "token"}, drawn
    indices) is where the page opens: the head `explain` ranks first for one token, that token
    pinned (None for a cross-attention)."""

    model: str
    text: str | None
    tokens: list[str]
    key_tokens: list[str] | None
    layer_ids: list[int] | None
    head_ids: list[int] | None
    causal: bool
    scale: float
    weights: np.ndarray
    mask: np.ndarray
    queries: np.ndarray | None
    keys: np.ndarray | None
    values: np.ndarray | None
    layer_masks: np.ndarray | None
    softcap: list[float | None] | None
    bias: np.ndarray | None
    head_stats: dict | None
    rollout: np.ndarray | None
    opening: dict | None = None
    #: `attnlab.explain.layer.LayerWalk.page_json()` for the opening, or None
    walk: dict | None = None

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(layers, H, L, S)"""
        return tuple(int(n) for n in self.weights.shape)

    @property
    def head_dims(self) -> tuple[int | None, int | None]:
        """(D, Dv), or (None, None) without queries, keys and values."""
        if self.queries is None or self.values is None:
            return None, None
        return int(self.queries.shape[-1]), int(self.values.shape[-1])


def page_payload(ma: ModelAttention, text: str | None = None, *, layer_ids=None,
                 head_ids=None, token: str | int | None = None,
                 special=None) -> PagePayload:
    """Everything the page draws for `ma`; `text` is the input as typed (the page's title);
    `token` the word the page opens on (see `opening`); `special` the model's special tokens
    (default: the usual spellings, [CLS], <s>...)."""
    n_layers, H, L, S = check_capture(ma)
    have_qkv = ma.queries is not None and ma.keys is not None and ma.values is not None
    query_tokens = getattr(ma, "query_tokens", None)
    qkv = {"queries": None, "keys": None, "values": None}
    if have_qkv:
        for name, a, rows in (("queries", ma.queries, L), ("keys", ma.keys, S),
                              ("values", ma.values, S)):
            a = np.asarray(a)
            if a.shape[:3] != (n_layers, H, rows):
                raise AttnlabError(f"{name}: expected ({n_layers}, {H}, {rows}, D), "
                                   f"got {fmt_shape(a.shape)}")
            qkv[name] = a
    weights = np.nan_to_num(np.asarray(ma.weights), nan=0.0)
    return PagePayload(
        model=str(ma.model_name), text=text,
        tokens=[str(t) for t in (ma.tokens if query_tokens is None else query_tokens)],
        key_tokens=None if query_tokens is None else [str(t) for t in ma.tokens],
        layer_ids=_ids("layer_ids", layer_ids, n_layers),
        head_ids=_ids("head_ids", head_ids, H),
        causal=bool(ma.causal), scale=float(ma.scale), weights=weights,
        mask=np.asarray(ma.mask, dtype=bool), **qkv, **_layer_scores(ma, n_layers, H, L, S),
        head_stats=_head_stats(ma) if query_tokens is None else None,
        # self-attention: attention rollout through every layer, heads averaged
        rollout=rollout(weights) if L == S else None,
        opening=opening(ma, token, special) if query_tokens is None else None,
    )


def opening(ma: ModelAttention, token: str | int | None = None, special=None) -> dict:
    """Where a page opens for a self-attention capture: {"layer", "head", "token"}, the head
    `attnlab explain` ranks first for `token` (a word of the text or an index; None: "it" when
    the text has it, else its first ordinary token), with that token pinned. Raises
    AttnlabError when a given `token` is not in the text."""
    names = (frozenset(t for t in ma.tokens if looks_special(t)) if special is None
             else frozenset(special))
    if token is None:
        try:
            pieces = find_word(ma.tokens, OPENING_WORD)
        except AttnlabError:
            plain = [i for i, t in enumerate(ma.tokens) if t not in names]
            pieces = [plain[0] if plain else 0]
    else:
        pieces = find_word(ma.tokens, token)
    focus = focus_of(ma, pieces)
    layer, head, _, _ = rank_heads(ma, focus, names)[0]
    return {"layer": int(layer), "head": int(head), "token": int(focus)}


def _ids(name: str, ids, n: int) -> list[int] | None:
    if ids is None:
        return None
    ids = [int(i) for i in ids]
    if len(ids) != n:
        raise AttnlabError(f"{name}: expected {n} (one per drawn one), got {len(ids)}")
    return ids


def _layer_scores(ma, n_layers: int, H: int, L: int, S: int) -> dict:
    """What each layer's scores went through besides q·k·scale: its own mask (a model mixing
    sliding-window and full layers), softcap (Gemma 2) and bias (T5's position bias)."""
    out = {"layer_masks": None, "softcap": None, "bias": None}
    masks = getattr(ma, "layer_masks", None)
    if masks is not None:
        masks = np.asarray(masks, dtype=bool)
        if masks.shape != (n_layers, L, S):
            raise AttnlabError(f"layer_masks: expected ({n_layers}, {L}, {S}), "
                               f"got {fmt_shape(masks.shape)}")
        out["layer_masks"] = masks
    softcap = getattr(ma, "softcap", None)
    if softcap is not None:
        if len(softcap) != n_layers:
            raise AttnlabError(f"softcap: expected {n_layers} (one per layer), got {len(softcap)}")
        out["softcap"] = [None if c is None else float(c) for c in softcap]
    bias = getattr(ma, "bias", None)
    if bias is not None:
        bias = np.asarray(bias)
        if bias.shape != (n_layers, H, L, S):
            raise AttnlabError(f"bias: expected ({n_layers}, {H}, {L}, {S}), "
                               f"got {fmt_shape(bias.shape)}")
        # -inf in a bias masks as the mask does: it stays -inf
        out["bias"] = np.nan_to_num(bias, nan=0.0, posinf=np.inf, neginf=-np.inf)
    return out


def _head_stats(ma) -> dict:
    """The heads view's data: every statistic per head, the labels, each label in words (why,
    or why none: `head_words`), and the label rules."""
    stats = head_stats(ma)
    doc = stats.to_json()
    words = [[head_words(stats, l, h) for h in range(stats.n_heads)]
             for l in range(stats.n_layers)]
    return {"stats": doc["stats"], "labels": doc["labels"], "words": words, "rules": rules_text()}
