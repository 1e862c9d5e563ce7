"""`intervene` and `record_heads`: context managers around any forward of a model running on
attnlab (a transformers model with attn_implementation="attnlab", or attnlab's GPT).

    with record_heads(model) as corrupt:
        model(**corrupt_inputs)                       # corrupt.z[layer]: (B, H, L, Dv)
    with intervene(model, [Patch(2, 1, corrupt), Ablate(0, 3)]):
        out = model(**clean_inputs)                    # forward only; the model is not copied

The model's weights are never touched: the edits happen to each head's context vector inside
the attention op's call (`attnlab.interventions.active`). Blocks nest: `record_heads` inside
`intervene` records the z each layer computed before its edit.
Caution: an edit addresses the model's self-attention layers by index; cross-attention is never
edited.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from attnlab.errors import AttnlabError
from attnlab.interventions import active
from attnlab.interventions.edits import HeadOutputs, build


def model_heads(model) -> tuple[int, int]:
    """(layers, query heads) of a transformers model running on attnlab or attnlab's GPT;
    AttnlabError when the model's attention does not go through attnlab."""
    config = getattr(model, "config", None)
    if config is None:
        raise AttnlabError(f"model: expected a transformers model or attnlab's GPT, got "
                           f"{type(model).__name__}")
    if hasattr(config, "n_layer") and hasattr(model, "blocks"):  # attnlab's GPT
        return int(config.n_layer), int(config.n_head)
    impl = getattr(config, "_attn_implementation", None)
    if impl != "attnlab":
        raise AttnlabError(f"model: its attention runs on {impl!r}, so attnlab cannot intervene; "
                           "load it with attn_implementation=\"attnlab\" (after "
                           "attnlab.adapters.hf.register()) or call "
                           "model.set_attn_implementation(\"attnlab\")")
    text = getattr(config, "get_text_config", lambda: config)()
    return int(text.num_hidden_layers), int(text.num_attention_heads)


@contextmanager
def _activated(plan: active.Plan, outer: active.Plan | None) -> Iterator[None]:
    """`plan` active inside the block, sharing the layers an enclosing plan has seen."""
    if outer is not None:
        plan.seen = outer.seen
    token = active.activate(plan)
    try:
        yield
    finally:
        active.deactivate(token)


@contextmanager
def intervene(model, edits) -> Iterator[active.Plan]:
    """Apply `edits` (Ablate, MeanAblate, Patch, FixPattern, or a list of them) to every forward
    of `model` inside the block. An edit whose layer never ran while others did raises on exit
    (AttnlabError): a model whose attention bypasses attnlab would otherwise be silently
    unedited."""
    n_layers, n_heads = model_heads(model)
    outer = active.active()
    plan = active.Plan(edits=build(edits, n_layers, n_heads),
                       stored=None if outer is None else outer.stored)
    with _activated(plan, outer):
        yield plan
    missed = sorted(set(plan.edits) - plan.seen)
    if plan.seen and missed:
        raise AttnlabError(f"edits: layers {missed} were never called through attnlab while "
                           f"layers {sorted(plan.seen)} were")


@contextmanager
def record_heads(model) -> Iterator[HeadOutputs]:
    """Collect every self-attention layer's per-head z (B, H, L, Dv) of the forward run inside
    the block (the last call of each layer is kept)."""
    model_heads(model)
    outer = active.active()
    rec = HeadOutputs({})
    plan = active.Plan(edits={} if outer is None else outer.edits, stored=rec.z)
    with _activated(plan, outer):
        yield rec
