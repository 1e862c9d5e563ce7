"""The edits an intervention makes to a head's context vector z (B, H, L, Dv), and `HeadOutputs`,
the z of every layer recorded from a run (what patching and mean ablation take their values from).

    Ablate(3, 5)                    # z of layer 3, head 5 = 0 (zero ablation)
    Ablate(3, 5, scale=0.5)         # z halved
    MeanAblate(3, 5, means)         # z = its mean over a reference set (`HeadOutputs.average`)
    Patch(3, 5, source)             # z = z of the same head in a recorded run of another input
    FixPattern(3, 5, pattern)       # the head's weights replaced by `pattern` (L, S): z = p @ v

Layers and heads are 0-based indices as in `attnlab explain` (negative counts from the last).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnlab.errors import AttnlabError, fmt_shape
from attnlab.interventions.active import LayerEdit


@dataclass
class HeadOutputs:
    """Per layer, the context vectors z (B, H, L|1, Dv) of every head: what `record_heads`
    collected from one run, or `average` of several runs (B = L = 1)."""

    z: dict[int, torch.Tensor]

    @classmethod
    def average(cls, runs: list[HeadOutputs]) -> HeadOutputs:
        """Each head's mean z over every batch row and token position of every run:
        `mean_z[l, h] = Σ_runs Σ_b Σ_i z[l][b, h, i] / (number of rows · positions)`, (1, H, 1, Dv).
        Runs of different lengths count each token once."""
        if not runs or not all(isinstance(r, HeadOutputs) for r in runs):
            raise AttnlabError(f"runs: expected a non-empty list of HeadOutputs, got {runs!r}")
        layers = set(runs[0].z)
        if any(set(r.z) != layers for r in runs):
            raise AttnlabError("runs: expected recordings of the same layers")
        out = {}
        for layer in sorted(layers):
            total = sum(r.z[layer].sum(dim=(0, 2), keepdim=True) for r in runs)  # (1, H, 1, Dv)
            count = sum(r.z[layer].shape[0] * r.z[layer].shape[2] for r in runs)
            out[layer] = total / count
        return cls(out)

    def __repr__(self) -> str:
        shapes = {k: fmt_shape(v.shape) for k, v in sorted(self.z.items())}
        return f"HeadOutputs({shapes})"


@dataclass(frozen=True)
class Ablate:
    """z of (layer, head) times `scale` (0: zero ablation)."""

    layer: int
    head: int
    scale: float = 0.0


@dataclass(frozen=True)
class MeanAblate:
    """z of (layer, head) replaced by its mean in `means` (`HeadOutputs.average`)."""

    layer: int
    head: int
    means: HeadOutputs


@dataclass(frozen=True)
class Patch:
    """z of (layer, head) replaced by the same head's z in `source` (`record_heads` of a run
    on another input with as many tokens)."""

    layer: int
    head: int
    source: HeadOutputs


@dataclass(frozen=True)
class FixPattern:
    """The head's weights replaced by `pattern` (L, S) or (B, L, S): z = pattern @ v. Any
    numbers are taken as given (rows need not sum to 1)."""

    layer: int
    head: int
    pattern: Any


EDITS = (Ablate, MeanAblate, Patch, FixPattern)


def index(name: str, value, n: int) -> int:
    """A 0-based index into n things (negative counts from the last), checked."""
    if isinstance(value, bool) or not isinstance(value, int) or not -n <= value < n:
        raise AttnlabError(f"{name}: expected an index in 0..{n - 1} (or -{n}..-1), "
                           f"got {value!r}")
    return value % n


def build(edits, n_layers: int, n_heads: int) -> dict[int, LayerEdit]:
    """The per-layer `LayerEdit`s of a list of edits, each (layer, head) edited at most once."""
    if isinstance(edits, EDITS):
        edits = [edits]
    by_layer: dict[int, dict[int, Any]] = {}
    for e in edits:
        if not isinstance(e, EDITS):
            raise AttnlabError(f"edits: expected Ablate, MeanAblate, Patch or FixPattern, got "
                               f"{type(e).__name__}")
        layer = index("layer", e.layer, n_layers)
        head = index("head", e.head, n_heads)
        heads = by_layer.setdefault(layer, {})
        if head in heads:
            raise AttnlabError(f"edits: layer {layer}, head {head} is edited twice")
        heads[head] = e
    return {layer: _layer_edit(layer, heads, n_heads) for layer, heads in by_layer.items()}


def _source(layer: int, head: int, e) -> torch.Tensor:
    """(B|1, L|1, Dv): what replaces z of the head."""
    rec = e.means if isinstance(e, MeanAblate) else e.source
    if not isinstance(rec, HeadOutputs):
        raise AttnlabError(f"{type(e).__name__}({layer}, {head}): expected HeadOutputs, got "
                           f"{type(rec).__name__}")
    if layer not in rec.z:
        raise AttnlabError(f"{type(e).__name__}({layer}, {head}): the recording has no layer "
                           f"{layer} (layers {sorted(rec.z)})")
    return rec.z[layer][:, head]


def _layer_edit(layer: int, heads: dict[int, Any], n_heads: int) -> LayerEdit:
    scale = torch.ones(1, n_heads, dtype=torch.float64)
    adds, patterns = {}, {}
    for head, e in heads.items():
        if isinstance(e, Ablate):
            scale[0, head] = float(e.scale)
        elif isinstance(e, FixPattern):
            patterns[head] = _pattern(layer, head, e.pattern)
        else:
            scale[0, head] = 0.0
            adds[head] = _source(layer, head, e)
    add = _stack(layer, adds, n_heads) if adds else None
    edit = LayerEdit(scale=scale, add=add)
    if patterns:
        edit.pattern = _stack(layer, patterns, n_heads)
        edit.fixed = torch.zeros(1, n_heads, dtype=torch.bool)
        edit.fixed[0, list(patterns)] = True
    if add is not None:
        edit.scale = scale.to(add.device)
    return edit


def _pattern(layer: int, head: int, p) -> torch.Tensor:
    p = torch.as_tensor(p)
    if p.dim() == 2:
        p = p[None]
    if p.dim() != 3 or not p.is_floating_point():
        raise AttnlabError(f"FixPattern({layer}, {head}): expected float weights (L, S) or "
                           f"(B, L, S), got {p.dtype} {fmt_shape(p.shape)}")
    return p


def _stack(layer: int, per_head: dict[int, torch.Tensor], n_heads: int):
    """(B|1, H, ...) zeros with each head's (B|1, ...) tensor in its slot."""
    shapes = [t.shape for t in per_head.values()]
    try:
        shape = torch.broadcast_shapes(*shapes)
    except RuntimeError:
        raise AttnlabError(f"edits at layer {layer}: the heads' values do not fit one shape: "
                           f"{', '.join(fmt_shape(s) for s in shapes)}") from None
    first = next(iter(per_head.values()))
    out = torch.zeros(shape[0], n_heads, *shape[1:], dtype=first.dtype, device=first.device)
    for head, t in per_head.items():
        out[:, head] = t
    return out
