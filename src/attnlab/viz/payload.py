"""A `PagePayload` (`attnlab.explain.page_payload`) as the JSON the browser views draw from (the
offline page and the web app).

Arrays travel as base64 of little-endian float32 (weights, queries, keys, values, bias, rollout)
and uint8 (masks): about 5.3 bytes a number instead of ~20 as JSON text, so a 64-token MiniLM page
stays a few MB. Float32 is what the model computed in; the step view recomputes softmax from it in
float64 (with each layer's own mask, softcap and bias) and shows its distance to the model's
weights.

One page can carry several captures (`document`): an encoder-decoder model's encoder, decoder and
cross attention, chosen in the page's "attention" list, and that list can also narrow one capture
to a block of query rows x key columns (bertviz's "Sentence A -> Sentence B").
"""

from __future__ import annotations

import base64

import numpy as np

from attnlab.capture import ModelAttention
from attnlab.errors import AttnlabError
from attnlab.explain.page_payload import PagePayload, page_payload


def _b64(a: np.ndarray | None, dtype) -> str | None:
    if a is None:
        return None
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<"))
                            .tobytes()).decode("ascii")


def page_json(p: PagePayload) -> dict:
    """The record as the page's JSON (version 1; the keys attn.js reads)."""
    n_layers, H, L, S = p.shape
    D, Dv = p.head_dims
    return {
        "version": 1, "model": p.model, "text": p.text, "tokens": p.tokens,
        "key_tokens": p.key_tokens, "layer_ids": p.layer_ids, "head_ids": p.head_ids,
        "causal": p.causal, "scale": p.scale,
        "n_layers": n_layers, "n_heads": H, "L": L, "S": S, "D": D, "Dv": Dv,
        "weights": _b64(p.weights, np.float32), "mask": _b64(p.mask, np.uint8),
        "queries": _b64(p.queries, np.float32), "keys": _b64(p.keys, np.float32),
        "values": _b64(p.values, np.float32),
        "layer_masks": _b64(p.layer_masks, np.uint8), "softcap": p.softcap,
        "bias": _b64(p.bias, np.float32),  # float32 bytes keep -inf
        "head_stats": p.head_stats, "rollout": _b64(p.rollout, np.float32),
        "opening": p.opening, "walk": p.walk,
    }


def payload(ma: ModelAttention, text: str | None = None, *, layer_ids=None,
            head_ids=None, token: str | int | None = None, special=None,
            walk: dict | None = None) -> dict:
    """The page's JSON for one capture: `page_json(page_payload(...))`; `token`: the word the
    page opens on (default "it" when the text has it), pinned, in the head explain ranks first;
    `walk`: `LayerWalk.page_json()` of that token, layer and head, for the step view."""
    p = page_payload(ma, text, layer_ids=layer_ids, head_ids=head_ids, token=token,
                     special=special)
    p.walk = walk
    return page_json(p)


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
