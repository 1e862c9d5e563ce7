"""ModelAttention: what one model run on one text did in every layer and head.

This is the hand-off between the code that runs a model (Hugging Face models through the adapter,
GPTs attnlab trained) and everything that interprets or draws it (explain, viz, the web app).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnlab.trace import Trace, trace


@dataclass
class ModelAttention:
    """Attention of every layer and head for one text (batch of one).

    weights (layers, H, L, S) are the softmax weights the model used; queries (layers, H, L, D),
    keys (layers, H, S, D) and values (layers, H, S, Dv) are per head, k/v heads repeated for GQA,
    queries before scaling; mask (L, S) is True where the model let query i attend key j.
    """

    tokens: list[str]
    weights: np.ndarray
    mask: np.ndarray
    scale: float
    model_name: str
    causal: bool
    queries: np.ndarray | None = None
    keys: np.ndarray | None = None
    values: np.ndarray | None = None

    @property
    def n_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def n_heads(self) -> int:
        return self.weights.shape[1]

    def _repr_html_(self) -> str:
        """Jupyter: the interactive page (head, model, step views) in a sandboxed iframe."""
        from attnlab.viz.notebook import model_html

        return model_html(self)

    def head_trace(self, layer: int, head: int) -> Trace:
        """Every step of one head (scores, scaled, masked, weights, output), in float64."""
        if self.queries is None or self.keys is None or self.values is None:
            raise ValueError("head_trace needs queries, keys and values; this capture has none")
        return trace(self.queries[layer, head], self.keys[layer, head], self.values[layer, head],
                     mask=self.mask, scale=self.scale, tokens=self.tokens)
