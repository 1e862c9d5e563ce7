"""The logit lens: what a causal language model would predict after each layer, reading the
residual stream through the model's final norm and unembedding (nostalgebraist 2020).

    lens = logit_lens(model, lambda: model(ids))    # (layers + 1, B, L, V) logits
    lens[0]                                         # the embeddings alone
    lens[-1]                                        # after the last layer: the model's logits

Works on attnlab's GPT (ln_f, lm_head) and transformers causal LMs with a final norm named
ln_f, norm, final_layernorm or final_layer_norm and output embeddings. Forward hooks on the
layers read the residual stream; nothing is copied, and the hooks are removed afterwards.
Caution: early layers' residuals were never trained to be read this way; their predictions
say what is linearly readable there through the final norm, not what the layer "thinks".
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlab.errors import AttnlabError
from attnlab.interventions.batched import find_layers

_NORMS = ("ln_f", "norm", "final_layernorm", "final_layer_norm")


def readout(model) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(final norm, unembedding) of a causal LM."""
    if hasattr(model, "blocks"):  # attnlab's GPT
        return model.ln_f, model.lm_head
    unembed = getattr(model, "get_output_embeddings", lambda: None)()
    base = getattr(model, "base_model", model)
    norm = next((getattr(base, n) for n in _NORMS if isinstance(getattr(base, n, None),
                                                                 torch.nn.Module)), None)
    if unembed is None or norm is None:
        raise AttnlabError(f"model: the logit lens needs a causal language model with a final "
                           f"norm and an unembedding; {type(model).__name__} has "
                           f"{'no unembedding' if unembed is None else 'no final norm'}")
    return norm, unembed


@torch.no_grad()
def logit_lens(model, run: Callable[[], object]) -> torch.Tensor:
    """(layers + 1, B, L, V): the residual stream before layer 0 and after each layer, through
    the final norm and unembedding, while `run()` runs `model` once."""
    norm, unembed = readout(model)
    layers = find_layers(model)
    stream: list[torch.Tensor] = []

    def first(module, args, kwargs):
        stream.append(args[0] if args else kwargs["hidden_states"])

    def after(module, args, output):
        stream.append(output[0] if isinstance(output, tuple) else output)

    handles = [layers[0].register_forward_pre_hook(first, with_kwargs=True)]
    handles += [layer.register_forward_hook(after) for layer in layers]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    if len(stream) != len(layers) + 1:
        raise AttnlabError(f"run: expected one forward of the model ({len(layers) + 1} residual "
                           f"states), got {len(stream)}")
    return torch.stack([unembed(norm(x)) for x in stream])  # (layers + 1, B, L, V)
