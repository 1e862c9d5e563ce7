"""What a model's attention layers computed: the hand-off from any model runner to explain and viz.

`AttentionCall` is the record of one attention call; every runner makes the same record (the
transformers adapter inside `attnlab.adapters.recording.record()`, attnlab's
`CausalSelfAttention(record=[])`). `ModelAttention.from_calls` turns the records of one run on
one text into `ModelAttention`, which explain interprets and viz draws;
`ModelAttention.from_attentions` builds one from the weights any model returns
(`output_attentions=True`), without queries, keys or values.

A data record that knows nothing of drawing: viz draws it, and registers how Jupyter shows it
(`attnlab.viz.notebook`). `check_capture` validates a capture's shapes once, for every reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab.errors import AttnlabError, fmt_shape
from attnlab.tracing import Trace, trace


@dataclass
class AttentionCall:
    """One attention call: per-head query (B, H, L, D), key (B, H, S, D), value (B, H, S, Dv)
    (k/v heads repeated for GQA, queries before scaling), allowed (B, 1|H, L, S) bool (True = may
    attend), weights (B, H, L, S) the softmax weights the model used.

    The record reproduces the weights: s = query @ keyᵀ · scale, then softcap · tanh(s / softcap)
    when `softcap` is set (Gemma 2), then + `bias` (B, 1|H, L, S) when set (T5's position bias,
    a float mask), and softmax over the allowed keys (a row with none: all 0).
    `layer` is the model's layer index when the runner knows it; `cross` marks cross-attention
    (keys from another sequence). The transformers adapter keeps float64 copies on the CPU;
    attnlab's modules keep the tensors they computed with.
    """

    layer: int | None
    query: Any
    key: Any
    value: Any
    allowed: Any
    weights: Any
    scale: float
    causal: bool
    bias: Any | None = None
    softcap: float | None = None
    cross: bool = False

    def __repr__(self) -> str:  # the tensors would print in full
        return (f"AttentionCall(layer={self.layer}, query {fmt_shape(self.query.shape)}, "
                f"key {fmt_shape(self.key.shape)}, value {fmt_shape(self.value.shape)}, "
                f"scale={self.scale:.4g}, causal={self.causal}, cross={self.cross})")


def _numpy(x) -> np.ndarray:
    """A tensor or array as a float64 (or bool) NumPy array on the CPU."""
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu()
        x = (x.double() if x.is_floating_point() else x).numpy()
    return np.asarray(x)


def _first(x) -> np.ndarray:
    """Batch element 0 of a recorded (B, ...) tensor, as NumPy."""
    return _numpy(x[0])


@dataclass
class ModelAttention:
    """Attention of every layer and head for one text (batch of one).

    weights (layers, H, L, S) are the softmax weights the model used; queries (layers, H, L, D),
    keys (layers, H, S, D) and values (layers, H, S, Dv) are per head, k/v heads repeated for GQA,
    queries before scaling; mask (L, S) is True where some layer let query i attend key j, and
    `layer_masks` (layers, L, S), when set, what each layer allowed (a model mixing sliding-window
    and full layers). `softcap` (one per layer, None where a layer has none) and `bias` (layers,
    H, L, S) float, when set, are what the scores went through before the softmax (see
    `AttentionCall`). `query_tokens`, when set, are the L query tokens of a cross-attention
    (keys from another text, e.g. an encoder's); `tokens` are then the S keys' (as in `Trace`).
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
    layer_masks: np.ndarray | None = None
    softcap: list[float | None] | None = None
    bias: np.ndarray | None = None
    query_tokens: list[str] | None = None

    @property
    def n_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def n_heads(self) -> int:
        return self.weights.shape[1]

    def layer_mask(self, layer: int) -> np.ndarray:
        """(L, S) bool: what `layer` let query i attend (True = may attend)."""
        return self.mask if self.layer_masks is None else self.layer_masks[layer]

    def __repr__(self) -> str:  # the arrays would print 100k characters
        parts = [f"{self.model_name!r}", f"{len(self.tokens)} tokens",
                 f"{self.n_layers} layers x {self.n_heads} heads",
                 f"causal={self.causal}"]
        if self.queries is not None:
            parts.append("with q, k, v")
        return f"ModelAttention({', '.join(parts)})"

    def head_trace(self, layer: int, head: int) -> Trace:
        """Every step of one head (scores, scaled, masked, weights, output), in float64, with the
        layer's own mask, softcap and bias."""
        if self.queries is None or self.keys is None or self.values is None:
            raise AttnlabError("head_trace: needs queries, keys and values; this capture has "
                               "weights only (from_attentions)")
        return trace(self.queries[layer, head], self.keys[layer, head], self.values[layer, head],
                     mask=self.layer_mask(layer), scale=self.scale, tokens=self.tokens,
                     softcap=None if self.softcap is None else self.softcap[layer],
                     bias=None if self.bias is None else self.bias[layer, head])

    @classmethod
    def from_calls(cls, calls: Sequence[AttentionCall], tokens: Sequence[str], *,
                   model_name: str) -> ModelAttention:
        """The self-attention over `tokens` of every layer, from the records of one run.

        Kept: calls that are not cross-attention and whose queries and keys are the text's
        tokens (L = S = len(tokens)), batch element 0, in call order (one per layer). Each layer
        keeps its own mask; softcaps and biases come along when any call has one.
        """
        n = len(tokens)
        own = [c for c in calls
               if not c.cross and c.query.shape[-2] == n and c.key.shape[-2] == n]
        if not own:
            raise AttnlabError(f"calls: none of {len(calls)} recorded attention calls is a "
                               f"self-attention over the {n} tokens")
        stack = lambda name: np.stack([_first(getattr(c, name)) for c in own])  # noqa: E731
        weights = stack("weights")  # (layers, H, L, S)
        H = weights.shape[1]
        masks = np.stack([np.broadcast_to(_first(c.allowed).astype(bool), (H, n, n))[0]
                          for c in own])  # (layers, L, S): one mask per layer, as the model had
        union = masks.any(axis=0)
        below = not np.triu(union, 1).any()
        causal = below and (any(c.causal for c in own) or not union.all())
        softcap = [c.softcap for c in own]
        bias = None
        if any(c.bias is not None for c in own):
            bias = np.zeros(weights.shape)  # (layers, H, L, S)
            for i, c in enumerate(own):
                if c.bias is not None:
                    bias[i] = np.broadcast_to(_first(c.bias), (H, n, n))
        return cls(
            tokens=[str(t) for t in tokens], weights=weights, mask=union,
            scale=float(own[0].scale), model_name=model_name, causal=bool(causal),
            queries=stack("query"), keys=stack("key"), values=stack("value"),
            layer_masks=None if (masks == union).all() else masks,
            softcap=None if all(s is None for s in softcap) else softcap, bias=bias,
        )

    @classmethod
    def from_attentions(cls, attentions, tokens: Sequence[str], *, model_name: str = "model",
                        include_layers: Sequence[int] | None = None,
                        name: str = "attentions",
                        query_tokens: Sequence[str] | None = None) -> ModelAttention:
        """Attention weights only, from the per-layer (batch, H, L, S) tensors a model
        returns with `output_attentions=True` (batch element 0 is kept).

        Every layer must have the same shape, L = S = len(tokens) (self-attention) or, for a
        cross-attention, S = len(tokens) keys and L = len(`query_tokens`); each row must be a
        probability distribution over the keys (non-negative, summing to 1; a row with no allowed
        key may be all 0). `include_layers` keeps those layers, in that order. The capture is
        causal when no layer puts weight above the diagonal; its mask is then the lower triangle,
        else the keys some layer gave weight to. `name` is the argument named in errors.
        """
        if isinstance(attentions, (str, bytes)) or not isinstance(attentions, Sequence) \
                or len(attentions) == 0:
            raise AttnlabError(f"{name}: expected a non-empty tuple or list of per-layer "
                               f"(batch, heads, L, S) tensors, got {type(attentions).__name__}")
        arrays = [_numpy(a) for a in attentions]
        for i, a in enumerate(arrays):
            if a.ndim != 4 or min(a.shape) == 0:
                raise AttnlabError(f"{name}[{i}]: expected (batch, heads, L, S), "
                                   f"got {fmt_shape(a.shape)}")
            if a.shape[1:] != arrays[0].shape[1:]:
                raise AttnlabError(f"{name}: layers differ in shape: [0] is "
                                   f"{fmt_shape(arrays[0].shape)}, [{i}] is {fmt_shape(a.shape)}")
        weights = np.stack([a[0] for a in arrays]).astype(np.float64)  # (layers, H, L, S)
        L, S = weights.shape[-2:]
        tokens = [str(t) for t in tokens]
        if query_tokens is not None:
            query_tokens = [str(t) for t in query_tokens]
            if len(query_tokens) != L:
                raise AttnlabError(f"query_tokens: expected {L} (one per query of {name}), "
                                   f"got {len(query_tokens)}")
        elif L != S:
            raise AttnlabError(f"{name}: expected self-attention (L = S), got "
                               f"{fmt_shape(arrays[0].shape)}")
        if len(tokens) != S:
            raise AttnlabError(f"tokens: expected {S} (one per key of {name}), got {len(tokens)}")
        if not np.isfinite(weights).all() or weights.min() < -1e-6:
            raise AttnlabError(f"{name}: expected probabilities (finite, >= 0), got values in "
                               f"[{np.nanmin(weights):.4g}, {np.nanmax(weights):.4g}]")
        sums = weights.sum(axis=-1)  # (layers, H, L)
        bad = ~(np.isclose(sums, 1.0, atol=1e-3) | np.isclose(sums, 0.0, atol=1e-6))
        if bad.any():
            lyr, h, i = (int(x) for x in np.argwhere(bad)[0])
            raise AttnlabError(f"{name}: expected each row to sum to 1 over the keys (softmax "
                               f"weights), got {sums[lyr, h, i]:.4g} at layer {lyr}, head {h}, "
                               f"query {i}")
        if include_layers is not None:
            picked = []
            for x in include_layers:
                if isinstance(x, bool) or not isinstance(x, (int, np.integer)) \
                        or not -len(arrays) <= x < len(arrays):
                    raise AttnlabError(f"include_layers: expected layer indices in "
                                       f"0..{len(arrays) - 1}, got {list(include_layers)!r}")
                picked.append(int(x) % len(arrays))
            if not picked:
                raise AttnlabError("include_layers: expected at least one layer, got []")
            weights = weights[picked]
        causal = query_tokens is None and not np.triu(weights, 1).any()
        mask = np.tril(np.ones((L, S), dtype=bool)) if causal else (weights != 0).any(axis=(0, 1))
        return cls(tokens=tokens, weights=weights, mask=mask, scale=1.0, model_name=model_name,
                   causal=bool(causal), query_tokens=query_tokens)


#: what readers of a capture use
_FIELDS = ("tokens", "weights", "mask", "scale", "model_name", "causal", "queries", "keys",
           "values")


def check_capture(ma: ModelAttention) -> tuple[int, int, int, int]:
    """Validate the shapes of a capture once, where a reader takes it; returns (layers, H, L, S).
    Any object with ModelAttention's fields passes (duck typing, as viz's callers rely on)."""
    if not all(hasattr(ma, name) for name in _FIELDS):
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
