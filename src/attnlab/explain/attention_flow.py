"""Where a token's information came from, through every layer: attention rollout and attention
flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

    >>> att = run_model("The cat sat on the mat because it was tired.")
    >>> r = rollout(att)   # (L, L): r[i, j] = share of top token i that came from input j
    >>> f = flow(att)

Per layer ℓ (1 … n), with Ā_ℓ the weights averaged over `heads` ("mean": all; an int or a list of
ints: those heads):

    Ã_ℓ = (Ā_ℓ + I), each row divided by its sum        (the residual connection as attention)
    rollout = Ã_n · … · Ã_2 · Ã_1

    flow[i, j] = the maximum flow from token i above layer n to token j below layer 1 in the
                 layered graph whose edge from (ℓ, i) down to (ℓ−1, j) has capacity Ã_ℓ[i, j];
                 then each row divided by its sum.

Both are (tokens, tokens) matrices whose rows sum to 1. A masked key has weight 0, so it has
neither a product term nor an edge: for a causal model both are lower-triangular. Max-flow is
scipy's (`scipy.sparse.csgraph.maximum_flow`, integer capacities: see CAPACITY_UNIT).
Caution: flow runs one max-flow per (i, j) pair on a graph of (layers + 1)·L nodes; it is meant
for sentences (13 tokens × 6 layers: ~0.15 s), not pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnlab.capture import ModelAttention
from attnlab.errors import AttnlabError
from attnlab.explain.residual import residual_matrices, rollout_of
from attnlab.explain.token import find_word, focus_of

__all__ = ["TokenSources", "flow", "flow_of", "flow_values", "residual_matrices", "rollout",
           "rollout_of", "token_sources"]


def _weights(capture):
    return capture.weights if hasattr(capture, "weights") else capture


def rollout(capture: ModelAttention | np.ndarray, heads="mean") -> np.ndarray:
    """Attention rollout (L, L): Ã_n · … · Ã_1 (module docstring). `capture`: a ModelAttention
    or its weights (layers, H, L, L)."""
    mats = residual_matrices(_weights(capture), heads)
    return rollout_of(mats)


def flow(capture: ModelAttention | np.ndarray, heads="mean") -> np.ndarray:
    """Attention flow (L, L): max-flow through the layered graph, rows summing to 1 (module
    docstring). `capture`: a ModelAttention or its weights (layers, H, L, L)."""
    return flow_of(residual_matrices(_weights(capture), heads))


#: capacities are integers for scipy's max-flow: Ã in units of 2⁻²⁶ (a flow is off by at most
#: L · 2⁻²⁷, ~1e-7 at 13 tokens; dyadic capacities such as ½ and ¼ are exact)
CAPACITY_UNIT = 2 ** 26


def flow_values(mats: np.ndarray) -> np.ndarray:
    """The raw max-flow values (L, L) through the layered graph of `mats` (layers, L, L).

    Node ℓ·L + t is token t below layer ℓ + 1 (ℓ = 0: the inputs, ℓ = n: above the top layer).
    """
    try:
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import maximum_flow
    except ImportError:
        raise AttnlabError("attention flow needs scipy: pip install 'attnlab[stats]'") from None
    n, L = mats.shape[0], mats.shape[-1]
    cap = np.rint(mats * CAPACITY_UNIT).astype(np.int32)  # (layers, L, L)
    layer, i, j = np.nonzero(cap)
    graph = csr_matrix((cap[layer, i, j], ((layer + 1) * L + i, layer * L + j)),
                       shape=((n + 1) * L, (n + 1) * L))  # edge (ℓ+1, i) -> (ℓ, j)
    reach = rollout_of(mats) > 0  # flow is 0 exactly where no path exists
    out = np.zeros((L, L))
    for a in range(L):
        for b in np.flatnonzero(reach[a]):
            out[a, b] = maximum_flow(graph, n * L + a, int(b)).flow_value / CAPACITY_UNIT
    return out


def flow_of(mats: np.ndarray) -> np.ndarray:
    """Flow values with each row divided by its sum."""
    values = flow_values(mats)
    return values / values.sum(-1, keepdims=True)


@dataclass
class TokenSources:
    """Where one token's information came from (`attnlab rollout`): `rollout` and `flow` are the
    (L, L) matrices of `heads` ("mean" or head indices); row `focus` is the token's."""

    model: str
    tokens: list[str]
    focus: int
    heads: str | list[int]
    rollout: np.ndarray
    flow: np.ndarray
    n_layers: int
    causal: bool

    def to_json(self) -> dict:
        """{"model", "tokens", "focus", "heads", "rollout", "flow"}: matrices rounded to 1e-6."""
        return {"model": self.model, "tokens": self.tokens, "focus": self.focus,
                "heads": self.heads, "rollout": self.rollout.round(6).tolist(),
                "flow": self.flow.round(6).tolist()}


def token_sources(att: ModelAttention, word: str | int, heads="mean") -> TokenSources:
    """Rollout and flow of `att` with the row of `word` (a token, a split word or an index)."""
    focus = focus_of(att, find_word(att.tokens, word))
    return TokenSources(model=att.model_name, tokens=list(att.tokens), focus=focus, heads=heads,
                        rollout=rollout(att, heads), flow=flow(att, heads),
                        n_layers=att.n_layers, causal=bool(att.causal))
