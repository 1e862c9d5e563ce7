"""ModelAttention as the JSON the browser views draw from (the offline page and the web app).

Arrays travel as base64 of little-endian float32 (weights, queries, keys, values) and uint8 (mask):
about 5.3 bytes a number instead of ~20 as JSON text, so a 64-token MiniLM page stays a few MB.
Float32 is what the model computed in; the step view recomputes softmax from it in float64 and
shows its distance to the model's weights.
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


def payload(ma: ModelAttention, text: str | None = None) -> dict:
    """Everything the page needs, JSON-ready. `text` is the input as typed (shown as the title)."""
    n_layers, H, L, S = check_capture(ma)
    have_qkv = ma.queries is not None and ma.keys is not None and ma.values is not None
    out = {
        "version": 1, "model": str(ma.model_name), "text": text,
        "tokens": [str(t) for t in ma.tokens], "causal": bool(ma.causal), "scale": float(ma.scale),
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
    out["head_stats"] = _head_stats(ma)
    out["rollout"] = None
    if L == S:  # self-attention: attention rollout through every layer, heads averaged
        from attnlab.explain.attention_flow import rollout

        out["rollout"] = _b64(rollout(np.nan_to_num(np.asarray(ma.weights), nan=0.0)),
                              np.float32)
    return out


def _head_stats(ma) -> dict:
    """The heads view's data: every statistic per head, the labels, and the label rules."""
    from attnlab.explain.heads import head_stats
    from attnlab.viz.heads_report import rules_text

    doc = head_stats(ma).to_json()
    return {"stats": doc["stats"], "labels": doc["labels"], "rules": rules_text()}
