"""The residual connection as attention, and rollout's product of it through the layers (the
definitions are in `attnlab.explain.attention_flow`'s docstring; this module holds the arithmetic
that `explain` also needs, below both)."""

from __future__ import annotations

import numpy as np

from attnlab.errors import AttnlabError


def residual_matrices(weights, heads="mean") -> np.ndarray:
    """Ã per layer: (layers, L, L) from weights (layers, H, L, L); see `attention_flow`."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise AttnlabError(f"weights: expected (layers, H, L, L) self-attention, got shape "
                           f"{w.shape}")
    H = w.shape[1]
    if isinstance(heads, str):
        if heads != "mean":
            raise AttnlabError(f"heads: expected 'mean', a head index or a list of them, got "
                               f"{heads!r}")
        picked = list(range(H))
    else:
        picked = [heads] if isinstance(heads, (int, np.integer)) else list(heads)
        if not picked or not all(isinstance(h, (int, np.integer)) and -H <= h < H
                                 for h in picked):
            raise AttnlabError(f"heads: expected indices in 0..{H - 1} (or -{H}..-1 from the "
                               f"last), got {heads!r}")
    a = w[:, picked].mean(axis=1)  # (layers, H', L, L) -> (layers, L, L)
    a = a + np.eye(a.shape[-1])
    return a / a.sum(-1, keepdims=True)


def rollout_of(mats: np.ndarray) -> np.ndarray:
    """The product Ã_n · … · Ã_1 of per-layer matrices (layers, L, L)."""
    out = np.eye(mats.shape[-1])
    for a in mats:
        out = a @ out  # (L, L) @ (L, L) -> (L, L): layer ℓ applied after the layers below
    return out
