"""Checks at the viz boundary: a capture's shapes, and layer/head/token indices into it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnlab.errors import AttnlabError, fmt_shape

if TYPE_CHECKING:  # the type only: viz imports no capture module at run time
    from attnlab.capture import ModelAttention

#: what viz reads of a ModelAttention
_FIELDS = ("tokens", "weights", "mask", "scale", "model_name", "causal", "queries", "keys",
           "values")


def check_capture(ma: ModelAttention) -> tuple[int, int, int, int]:
    """Validate the shapes of a capture once, at the viz boundary; returns (layers, H, L, S)."""
    if not all(hasattr(ma, name) for name in _FIELDS):  # by its fields: no import of capture
        raise AttnlabError(f"attention: expected a ModelAttention, got {type(ma).__name__}")
    w = np.asarray(ma.weights)
    if w.ndim != 4:
        raise AttnlabError(f"weights: expected (layers, H, L, S), got {fmt_shape(w.shape)}")
    n_layers, H, L, S = w.shape
    if min(w.shape) == 0:
        raise AttnlabError(f"weights: expected no empty dims, got {fmt_shape(w.shape)}")
    if len(ma.tokens) != S:
        raise AttnlabError(f"tokens: expected {S} (one per key), got {len(ma.tokens)}")
    query_tokens = getattr(ma, "query_tokens", None)  # a cross-attention's queries
    if query_tokens is not None and len(query_tokens) != L:
        raise AttnlabError(f"query_tokens: expected {L} (one per query), got {len(query_tokens)}")
    if np.shape(ma.mask) != (L, S):
        raise AttnlabError(f"mask: expected (L, S) = ({L}, {S}), "
                           f"got {fmt_shape(np.shape(ma.mask))}")
    return n_layers, H, L, S


def check_index(name: str, value, n: int, what: str) -> int:
    """`value` as an index into `n` things (negative counts from the end, like Python)."""
    try:
        i = int(value)
    except (TypeError, ValueError):
        raise AttnlabError(f"{name}: expected an integer, got {value!r}") from None
    if isinstance(value, bool) or i != value or not -n <= i < n:
        raise AttnlabError(f"{name}: expected 0..{n - 1} (there are {n} {what}), got {value!r}")
    return i % n
