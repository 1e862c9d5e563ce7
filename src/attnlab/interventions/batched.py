"""Every single-head edit of one input in one batched forward: `sweep`.

    out, rows = sweep(model, lambda: model(**inputs))          # every (layer, head) ablated
    out.last_hidden_state[0]                                    # the unedited run
    out.last_hidden_state[1 + i]                                # with head rows[i] ablated

Row 0 is the input as it is; row 1 + i has head rows[i] = (layer, head) zero-ablated, or, with
`values` (a `HeadOutputs`: `HeadOutputs.average` for mean ablation, a `record_heads` of another
input for patching), replaced by that head's z there.

The batch grows as it goes: an edit at layer l changes nothing before l, so the forward starts
with the one input and, on entering layer l, appends one copy of the unedited row 0 for each edit
at l (a forward pre-hook on each layer, removed afterwards). Layers before l never run on the
rows edited at l: for all 72 heads of a 6-layer, 12-head model, 258 row-layers instead of 438.
Caution: the input must be a batch of one, run with no KV cache (the layers' batch changes
mid-forward); transformers models are called by `run`, which should pass use_cache=False to a
decoder. Outputs collected per layer (hidden states, attentions) have that layer's batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from attnlab.errors import AttnlabError
from attnlab.interventions import active
from attnlab.interventions.edits import HeadOutputs, index
from attnlab.interventions.run import model_heads


def find_layers(model) -> nn.ModuleList:
    """The model's stack of layers: attnlab GPT's `blocks`, or a transformers model's one
    ModuleList of n_layers layers that each hold an attention module with a `layer_idx`."""
    n_layers, _ = model_heads(model)
    if hasattr(model, "blocks") and isinstance(model.blocks, nn.ModuleList):
        return model.blocks
    found = [m for m in model.modules()
             if isinstance(m, nn.ModuleList) and len(m) == n_layers
             and all(any(hasattr(s, "layer_idx") for s in layer.modules()) for layer in m)]
    if len(found) != 1:
        raise AttnlabError(f"model: expected one stack of {n_layers} layers, found {len(found)} "
                           "(an encoder-decoder model has two; sweep one model at a time)")
    return found[0]


def sweep(model, run: Callable[[], object], heads: Sequence[tuple[int, int]] | None = None,
          values: HeadOutputs | None = None):
    """(what `run()` returns with batch 1 + len(rows), rows): row 0 unedited, row 1 + i with
    head rows[i] ablated (or replaced by `values`). `heads` default: every (layer, head); rows
    are the heads sorted by layer. `run` runs `model` on a batch of one."""
    n_layers, n_heads = model_heads(model)
    if heads is None:
        heads = [(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    rows = sorted({(index("layer", lyr, n_layers), index("head", h, n_heads)) for lyr, h in heads})
    if not rows:
        raise AttnlabError("heads: expected at least one (layer, head)")
    if values is not None and not isinstance(values, HeadOutputs):
        raise AttnlabError(f"values: expected HeadOutputs, got {type(values).__name__}")
    edits = {layer: _edit(rows, layer, n_heads, values) for layer in {lyr for lyr, _ in rows}}
    grow = {layer: sum(1 for lyr, _ in rows if lyr == layer) for layer in edits}
    handles = [layer.register_forward_pre_hook(_grower(grow.get(i, 0)), with_kwargs=True)
               for i, layer in enumerate(find_layers(model))]
    plan = active.Plan(edits=edits)
    token = active.activate(plan)
    try:
        out = run()
    finally:
        active.deactivate(token)
        for h in handles:
            h.remove()
    if set(edits) - plan.seen:
        raise AttnlabError(f"model: layers {sorted(set(edits) - plan.seen)} never ran through "
                           "attnlab")
    return out, rows


def _edit(rows, layer: int, n_heads: int, values: HeadOutputs | None) -> active.LayerEdit:
    """Layer `layer`'s edit over the batch it runs on: 1 + the rows edited at or before it."""
    B = 1 + sum(1 for lyr, _ in rows if lyr <= layer)
    scale = torch.ones(B, n_heads, dtype=torch.float64)
    here = [(r, h) for r, (lyr, h) in enumerate(rows, start=1) if lyr == layer]
    for r, h in here:
        scale[r, h] = 0.0
    if values is None:
        return active.LayerEdit(scale=scale)
    if layer not in values.z:
        raise AttnlabError(f"values: no layer {layer} in the recording (layers "
                           f"{sorted(values.z)})")
    z = values.z[layer]  # (1, H, L|1, Dv)
    if z.shape[0] != 1:
        raise AttnlabError(f"values: expected a recording of one input, got batch {z.shape[0]}")
    add = torch.zeros(B, *z.shape[1:], dtype=z.dtype, device=z.device)  # (B, H, L|1, Dv)
    for r, h in here:
        add[r, h] = z[0, h]
    return active.LayerEdit(scale=scale.to(z.device), add=add)


def _grower(n: int):
    """A forward pre-hook appending n copies of row 0 to the layer's hidden states."""
    def hook(module, args, kwargs):
        if n == 0:
            return None
        if args:
            x = args[0]
            return (_grow(x, n), *args[1:]), kwargs
        x = kwargs["hidden_states"]
        return args, {**kwargs, "hidden_states": _grow(x, n)}
    return hook


def _grow(x: torch.Tensor, n: int) -> torch.Tensor:
    return torch.cat([x, x[:1].expand(n, *x.shape[1:])])  # (B, L, C) -> (B + n, L, C)
