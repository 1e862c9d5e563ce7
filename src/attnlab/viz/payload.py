"""ModelAttention as the JSON the browser views draw from (the offline page and the web app).

Arrays travel as base64 of little-endian float32 (weights, queries, keys, values, bias) and uint8
(masks): about 5.3 bytes a number instead of ~20 as JSON text, so a 64-token MiniLM page stays a
few MB. Float32 is what the model computed in; the step view recomputes softmax from it in float64
(with each layer's own mask, softcap and bias) and shows its distance to the model's weights.

One page can carry several captures (`document`): an encoder-decoder model's encoder, decoder and
cross attention, chosen in the page's "attention" list, and that list can also narrow one capture
to a block of query rows x key columns (bertviz's "Sentence A -> Sentence B").
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import numpy as np

from attnlab.errors import AttnlabError, fmt_shape
from attnlab.viz.checks import check_capture

if TYPE_CHECKING:  # the type only: viz imports no capture module at run time
    from attnlab.capture import ModelAttention


def _b64(a: np.ndarray, dtype) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<"))
                            .tobytes()).decode("ascii")


def payload(ma: ModelAttention, text: str | None = None, *, layer_ids=None,
            head_ids=None) -> dict:
    """Everything the page needs, JSON-ready. `text` is the input as typed (shown as the title).

    `tokens` are the L queries' and `key_tokens` the S keys' when they differ (cross-attention),
    else None. `layer_ids` / `head_ids` name the layers and heads drawn when they are a selection
    of the model's (the labels say "L5", not "L1"); None: 0, 1, 2, ...
    """
    n_layers, H, L, S = check_capture(ma)
    have_qkv = ma.queries is not None and ma.keys is not None and ma.values is not None
    query_tokens = getattr(ma, "query_tokens", None)
    out = {
        "version": 1, "model": str(ma.model_name), "text": text,
        "tokens": [str(t) for t in (ma.tokens if query_tokens is None else query_tokens)],
        "key_tokens": None if query_tokens is None else [str(t) for t in ma.tokens],
        "layer_ids": _ids("layer_ids", layer_ids, n_layers),
        "head_ids": _ids("head_ids", head_ids, H),
        "causal": bool(ma.causal), "scale": float(ma.scale),
        "n_layers": n_layers, "n_heads": H, "L": L, "S": S,
        "D": int(ma.queries.shape[-1]) if have_qkv else None,
        "Dv": int(ma.values.shape[-1]) if have_qkv else None,
        "weights": _b64(np.nan_to_num(np.asarray(ma.weights), nan=0.0), np.float32),
        "mask": _b64(np.asarray(ma.mask, dtype=bool), np.uint8),
        "queries": None, "keys": None, "values": None,
    }
    if have_qkv:
        for name, a, rows in (("queries", ma.queries, L), ("keys", ma.keys, S),
                              ("values", ma.values, S)):
            a = np.asarray(a)
            if a.shape[:3] != (n_layers, H, rows):
                raise AttnlabError(f"{name}: expected ({n_layers}, {H}, {rows}, D), "
                                   f"got {fmt_shape(a.shape)}")
            out[name] = _b64(a, np.float32)
    out.update(_layer_scores(ma, n_layers, H, L, S))
    out["head_stats"] = _head_stats(ma) if query_tokens is None else None
    out["rollout"] = None
    if L == S:  # self-attention: attention rollout through every layer, heads averaged
        from attnlab.explain.attention_flow import rollout

        out["rollout"] = _b64(rollout(np.nan_to_num(np.asarray(ma.weights), nan=0.0)),
                              np.float32)
    return out


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
        out["layer_masks"] = _b64(masks, np.uint8)
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
        # -inf in a bias masks as the mask does: float32 bytes keep it as -inf
        out["bias"] = _b64(np.nan_to_num(bias, nan=0.0, posinf=np.inf, neginf=-np.inf),
                           np.float32)
    return out


def document(parts: list[tuple[str, dict]], choices: list[dict] | None = None) -> dict:
    """Several payloads in one page: `parts` are (name, payload); `choices` the entries of the
    page's "attention" list, each {"name", "set": index into parts, "rows": [i0, i1],
    "cols": [j0, j1]} (rows/cols optional: all). Default: one entry per part."""
    if choices is None:
        choices = [{"name": name, "set": k} for k, (name, _) in enumerate(parts)]
    for c in choices:
        d = parts[c["set"]][1]
        for key, n in (("rows", d["L"]), ("cols", d["S"])):
            a, b = c.get(key, (0, n))
            if not 0 <= a < b <= n:
                raise AttnlabError(f"choices: {c['name']!r} {key} expected a range in 0..{n}, "
                                   f"got [{a}, {b})")
    return {"version": 1, "sets": [p for _, p in parts], "choices": choices}


def _head_stats(ma) -> dict:
    """The heads view's data: every statistic per head, the labels, and the label rules."""
    from attnlab.explain.heads import head_stats
    from attnlab.viz.heads_report import rules_text

    doc = head_stats(ma).to_json()
    return {"stats": doc["stats"], "labels": doc["labels"], "rules": rules_text()}
