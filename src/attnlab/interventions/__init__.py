"""Interventions in the attention op: what a head is for, not only where it looks.

    from attnlab.interventions import Ablate, Patch, intervene, record_heads, sweep
    with record_heads(model) as corrupt:
        model(**corrupt_inputs)
    with intervene(model, [Ablate(3, 5), Patch(2, 1, corrupt)]):
        out = model(**clean_inputs)
    out, rows = sweep(model, lambda: model(**clean_inputs))   # every head ablated, one pass

Works on any model running on attnlab: transformers models through `attnlab.adapters.hf`
(attn_implementation="attnlab") and attnlab's GPT. Forward only; the model is not copied.
Measures of the effect: `attnlab.interventions.measures`; the logit lens: `.lens`.
Sits below explain and above capture: the runners call `active.apply`, which imports only torch.
"""

from __future__ import annotations

import importlib

_NAMES = {
    "Ablate": "edits", "MeanAblate": "edits", "Patch": "edits", "FixPattern": "edits",
    "HeadOutputs": "edits", "intervene": "run", "record_heads": "run", "model_heads": "run",
    "sweep": "batched", "find_layers": "batched", "logit_lens": "lens", "readout": "lens",
    "next_token_logprob": "measures", "logit_difference": "measures", "text_loss": "measures",
    "token_cosine": "measures", "mean_pool": "measures", "embedding_similarity": "measures",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'attnlab.interventions' has no attribute {name!r}")
    return getattr(importlib.import_module(f"attnlab.interventions.{_NAMES[name]}"), name)


def __dir__():
    return sorted(set(globals()) | set(__all__))
