"""Trace: every intermediate of one attention call, in float64, for looking inside.

    >>> t = trace([[2, 1]], [[3, 1], [0, 4], [1, 1]], [[1, 0], [0, 1], [1, 1]],
    ...           scale=1.0, tokens=["cat", "mat", "because"])
    >>> t.scores.tolist()
    [[7.0, 4.0, 3.0]]

The steps are the lesson's: compare (scores), scale (scaled_scores), mask (masked_scores),
normalize (weights), borrow (output). Computed by `attnlab.reference`, the float64 oracle.
A data record: Jupyter shows it through the display `attnlab.viz.notebook` registers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attnlab import reference
from attnlab.errors import AttnlabError, check_scale, check_softcap, fmt_shape
from attnlab.masks import Mask


@dataclass
class Trace:
    """Inputs and intermediates of attention, float64 arrays of shape (..., L, S) or (..., L, D).

    query (..., H, L, D), key (..., Hkv, S, D), value (..., Hkv, S, Dv); mask bool (True = may
    attend) broadcastable to the scores, or None; scores = q·k, scaled_scores = scores·scale,
    masked_scores (-inf where masked), weights = softmax (rows sum to 1, or 0 if all masked),
    output = weights @ value, lse = log-sum-exp of each row.
    """

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    mask: np.ndarray | None
    scale: float
    scores: np.ndarray
    scaled_scores: np.ndarray
    masked_scores: np.ndarray
    weights: np.ndarray
    output: np.ndarray
    lse: np.ndarray
    tokens: list[str] | None = None
    query_tokens: list[str] | None = field(default=None)

    def __post_init__(self):
        if (self.query_tokens is None and self.tokens is not None
                and len(self.tokens) == self.query.shape[-2]):
            self.query_tokens = list(self.tokens)

    def to_dict(self) -> dict:
        """JSON-ready: arrays as nested lists, -inf/NaN as None."""
        arrays = ("query", "key", "value", "mask", "scores", "scaled_scores", "masked_scores",
                  "weights", "output", "lse")
        return {"tokens": self.tokens, "query_tokens": self.query_tokens, "scale": self.scale,
                **{name: jsonable(getattr(self, name)) for name in arrays}}

    def __repr__(self):
        return (f"Trace(query {fmt_shape(self.query.shape)}, key {fmt_shape(self.key.shape)}, "
                f"value {fmt_shape(self.value.shape)}, scale={self.scale:.4g}, "
                f"masked={self.mask is not None})")


def jsonable(a):
    """Nested lists of a NumPy array, non-finite numbers as None (JSON has no inf)."""
    if a is None:
        return None
    a = np.asarray(a)
    if a.dtype == bool:
        return a.tolist()
    return np.where(np.isfinite(a), a, None).tolist()


def _as_array(name: str, x) -> np.ndarray:
    try:
        if hasattr(x, "detach"):  # torch tensor
            x = x.detach().cpu().double().numpy()
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise AttnlabError(f"{name}: expected numbers (list, NumPy array or tensor): {e}") from None
    if a.ndim < 2:
        raise AttnlabError(f"{name}: expected at least 2 dims (L, D), got {fmt_shape(a.shape)}")
    return a


def trace(query, key, value, mask=None, scale=None, tokens=None, query_tokens=None, *,
          bias=None, softcap=None) -> Trace:
    """Run attention in float64 and keep every intermediate.

    query (L, D) or (..., H, L, D); key (S, D) or (..., Hkv, S, D); value (S, Dv) or
    (..., Hkv, S, Dv). `mask`: an `attnlab.masks` Mask, or a bool array (True = may attend)
    broadcastable to the scores. `scale`: default 1/sqrt(D). `tokens`: labels of the S keys
    (and of the queries when L == S). `softcap` (Gemma 2) caps the scaled scores and `bias`, a
    float array broadcastable to the scores, is added after it, as `attnlab.attention` does;
    `scaled_scores` then holds the capped scores and `masked_scores` includes the bias.
    """
    q, k, v = _as_array("query", query), _as_array("key", key), _as_array("value", value)
    if q.ndim != k.ndim or k.ndim != v.ndim:
        raise AttnlabError(f"query, key, value: expected the same number of dims, got "
                           f"{fmt_shape(q.shape)}, {fmt_shape(k.shape)}, {fmt_shape(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise AttnlabError(f"key: expected head dim D = {q.shape[-1]} like query "
                           f"{fmt_shape(q.shape)}, got {fmt_shape(k.shape)}")
    if k.shape[:-1] != v.shape[:-1]:
        raise AttnlabError(f"value: expected leading dims {fmt_shape(k.shape[:-1])} like key, "
                           f"got {fmt_shape(v.shape)}")
    L, S = q.shape[-2], k.shape[-2]
    dense = _dense_mask(mask, L, S, q.shape[-4] if q.ndim >= 4 else 1,
                        q.shape[-3] if q.ndim >= 3 else 1)
    if tokens is not None and len(tokens) != S:
        raise AttnlabError(f"tokens: expected {S} labels (one per key), got {len(tokens)}")
    scale = None if scale is None else check_scale(scale, q.shape[-1])
    softcap = check_softcap(softcap)
    if bias is not None:
        bias = _as_array("bias", bias)  # (..., L, S)
    s = reference.steps(q, k, v, mask=dense, scale=scale, bias=bias, softcap=softcap)
    used_scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else float(scale)
    return Trace(query=q, key=k, value=v, mask=dense, scale=used_scale, tokens=
                 None if tokens is None else [str(t) for t in tokens],
                 query_tokens=None if query_tokens is None else [str(t) for t in query_tokens],
                 **s)


def _dense_mask(mask, L: int, S: int, B: int = 1, H: int = 1) -> np.ndarray | None:
    if mask is None:
        return None
    if isinstance(mask, Mask):
        mask = mask.for_call(B, H)  # a mask function reading b or h: at every b and h
        mask.check(L, S)
        d = mask.to_dense(L, S).numpy()  # (Bm, Hm, L, S)
        return d[0, 0] if d.shape[:2] == (1, 1) else d
    m = mask.detach().cpu().numpy() if hasattr(mask, "detach") else np.asarray(mask)
    if m.dtype != bool:
        raise AttnlabError(f"mask: expected bool (True = may attend) or an attnlab mask, "
                           f"got dtype {m.dtype}")
    if m.shape[-2:] != (L, S):
        raise AttnlabError(
            f"mask: expected (..., L, S) = (..., {L}, {S}), got {fmt_shape(m.shape)}")
    return m
