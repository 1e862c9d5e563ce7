"""The one place a model runner hands a head's context vectors to the active intervention.

Every attention call of a model running on attnlab (the transformers adapter, attnlab's
`CausalSelfAttention`) passes its per-head output z (B, H, L, Dv), before the heads are merged
and projected, through `apply(layer, z, value)`. With no `attnlab.interventions.intervene` (or
`record_heads`) block active this costs one ContextVar read and returns z itself.

A block's state is a `Plan`: per layer a `LayerEdit`, applied as

    z[b, h] = pattern[b, h] @ v[b, h]   where a pattern is fixed for (b, h)
    z[b, h] = scale[b, h] · z[b, h] + add[b, h]

(scale 0: ablation; scale 0 plus add: mean ablation or patching; scale 1, add 0: untouched, which
leaves z bit for bit as it was), and, when recording, the z of every layer before its edit.
Only torch here: the runners import this module, the higher parts of `attnlab.interventions`
import the runners.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from attnlab.errors import AttnlabError, fmt_shape


@dataclass
class LayerEdit:
    """What one layer's heads get. scale (B|1, H); add (B|1, H, L|1, Dv) or None; pattern
    (B|1, H, L, S) with `fixed` (B|1, H) bool saying which heads take it, or None."""

    scale: torch.Tensor
    add: torch.Tensor | None = None
    pattern: torch.Tensor | None = None
    fixed: torch.Tensor | None = None


@dataclass
class Plan:
    """The edits of an active block, by layer; `stored` collects each layer's z when not None;
    `seen` the layers whose attention ran (so a block can tell an edit that never applied)."""

    edits: dict[int, LayerEdit] = field(default_factory=dict)
    stored: dict[int, torch.Tensor] | None = None
    seen: set[int] = field(default_factory=set)


_ACTIVE: ContextVar[Plan | None] = ContextVar("attnlab_intervention", default=None)


def active() -> Plan | None:
    return _ACTIVE.get()


def apply(layer: int | None, z: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """z (B, H, L, Dv) after the active plan's edit of `layer`; value (B, Hkv, S, Dv) is what a
    fixed pattern borrows from. `layer` None (a cross-attention, a module without an index) is
    never edited."""
    plan = _ACTIVE.get()
    if plan is None or layer is None:
        return z
    plan.seen.add(layer)
    if plan.stored is not None:
        plan.stored[layer] = z.detach()
    edit = plan.edits.get(layer)
    return z if edit is None else _edit(layer, edit, z, value)


def _edit(layer: int, e: LayerEdit, z: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    B, H, L, Dv = z.shape
    _check(layer, "scale", e.scale, (B, H))
    if e.pattern is not None:
        _check(layer, "pattern", e.pattern, (B, H, L, value.shape[-2]))
        v = value.repeat_interleave(H // value.shape[-3], dim=-3)  # (B, Hkv, S, Dv) -> (B, H, ...)
        fixed = (e.pattern.to(v.dtype) @ v)  # (B|1, H, L, S) @ (B, H, S, Dv) -> (B, H, L, Dv)
        z = torch.where(e.fixed[..., None, None], fixed, z)
    z = z * e.scale.to(z.dtype)[..., None, None]  # (B, H, L, Dv) · (B|1, H, 1, 1)
    if e.add is not None:
        _check(layer, "add", e.add, (B, H, L, Dv))
        z = z + e.add.to(z.dtype)
    return z


def _check(layer: int, name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if t.dim() != len(shape) or any(a not in (1, b) for a, b in zip(t.shape, shape)):
        raise AttnlabError(f"intervention at layer {layer}: its {name} {fmt_shape(t.shape)} does "
                           f"not fit the call's heads {fmt_shape(shape)} (another text length "
                           "or batch than the edit was made for?)")


def activate(plan: Plan):
    """Make `plan` the active one; returns the token for `deactivate`."""
    return _ACTIVE.set(plan)


def deactivate(token) -> None:
    _ACTIVE.reset(token)
