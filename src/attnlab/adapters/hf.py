"""Hugging Face transformers models running on attnlab.attention.

    >>> from attnlab.adapters import hf
    >>> hf.register()                                   # once; idempotent
    >>> model = AutoModel.from_pretrained(path, attn_implementation="attnlab")
    >>> model.set_attn_implementation("attnlab")        # or switch a loaded model
    >>> out = model(**inputs, output_attentions=True)   # exact softmax weights, per layer

How it plugs in (transformers 5): an attention function registered in `AttentionInterface` receives
(module, query (B, H, L, D), key (B, Hkv, S, D), value (B, Hkv, S, Dv), attention_mask, scaling,
dropout, **kwargs) and returns (output (B, L, H, Dv), weights (B, H, L, S) or None). The masks come
from `AttentionMaskInterface`: a name missing there gets *no mask at all* (padding silently lost),
so `register()` installs a mask builder under the same name (`hf_masks.attnlab_mask`): an attnlab
structured mask for causal and sliding-window calls with left or right padding (no (B, 1, L, S)
matrix: the interval kernel for a prefill, the decode kernel for each step), else transformers'
SDPA mask builder. That builder gives a
bool mask (True = may attend, attnlab's convention) or None when the mask is plain causal or
plain full, in which case causality comes from `module.is_causal` (never for one query row: a
decoding step sees the whole cache). A float mask a caller built itself is added to the scores.

Weights are returned whenever transformers collects attentions (`output_attentions=True` in the
call or the config, seen through its output-capturing hooks or a keyword) or a `recording.record()`
block is active, and never otherwise: the op returns the log-sum-exp of each row and
`attnlab.attention_weights` recomputes the weights exactly from it, exp(score - lse), never by a
second softmax, a block of `WEIGHT_ROWS` rows at a time. The call is validated once: output,
weights and the recording all come from the same `Problem`.
Each call's per-head output passes through `attnlab.interventions` (ablation, patching) before
it is returned; with no intervention active it is returned as computed.
Caution: in training mode with dropout the returned weights are those before dropout, and under
an intervention the weights the op computed (a fixed pattern changes the output only). Logit
softcapping (Gemma 2) and learned attention sinks (GPT-OSS's `s_aux`) are passed on to the op;
a recording of a call with sinks is refused (the lesson's steps have no sink).
"""

from __future__ import annotations

import torch

from attnlab.adapters import hf_masks, recording
from attnlab.errors import AttnlabError
from attnlab.interventions import active as interventions
from attnlab.masks import Mask
from attnlab.ops.api import WEIGHT_ROWS, attention, make_problem, run_with_weights

NAME = "attnlab"


def register() -> str:
    """Make `attn_implementation="attnlab"` available to every transformers model; returns the name.

    Calling it again changes nothing.
    """
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise AttnlabError(
            f"attnlab.adapters.hf needs transformers >= 5: pip install 'attnlab[hf]' ({e})"
        ) from None
    if AttentionInterface._global_mapping.get(NAME) is not attnlab_attention_forward:
        AttentionInterface.register(NAME, attnlab_attention_forward)
    if AttentionMaskInterface._global_mapping.get(NAME) is not hf_masks.attnlab_mask:
        AttentionMaskInterface.register(NAME, hf_masks.attnlab_mask)
    return NAME


def _is_causal(module, is_causal, attention_mask, L: int) -> bool:
    # The same rule as transformers' SDPA integration: a materialised mask already holds the
    # causal pattern; without one, the module says, and one query row (decoding) sees everything.
    if attention_mask is not None or L <= 1:
        return False
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    return bool(causal)


def _collector() -> dict | None:
    """What transformers' output capturing collects right now: a dict keyed by output name
    ("attentions", "cross_attentions", ...) while a `capture_outputs` forward runs, else None."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # a transformers without output capturing passes output_attentions on
        return None
    return _active_collector.get()


def _wants_weights(kwargs) -> bool:
    # transformers 5 models decorated with `capture_outputs` (GPT-2, BERT, ...) pop
    # output_attentions before the layers run and collect the weights the attention modules
    # return through forward hooks, so the active collector, not a keyword, says what is
    # wanted. It cannot say which hook a call feeds (T5 hooks the layer wrapping the attention),
    # so any *attentions output being collected asks every attention call for its weights, as
    # eager always computes them.
    if kwargs.get("output_attentions") or recording.recording():
        return True
    collecting = _collector()
    return collecting is not None and any(name.endswith("attentions") for name in collecting)


def _with_position_bias(position_bias, attention_mask, causal: bool):
    """One float mask holding a learned position bias (T5) and every mask: bias where a pair may
    attend, -inf where not."""
    L, S = position_bias.shape[-2:]
    if causal:  # fold causality in too, so the one mask says everything
        attention_mask = torch.ones(L, S, dtype=torch.bool, device=position_bias.device).tril()
    if attention_mask is None:
        return position_bias
    if attention_mask.dtype == torch.bool:
        fill = torch.tensor(float("-inf"), dtype=position_bias.dtype, device=position_bias.device)
        return torch.where(attention_mask, position_bias, fill)
    return position_bias + attention_mask


def attnlab_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The transformers attention function for `attn_implementation="attnlab"`.

    query (B, H, L, D), key (B, Hkv, S, D), value (B, Hkv, S, Dv) -> (output (B, L, H, Dv),
    weights (B, H, L, S) when asked for, else None).
    """
    sinks = kwargs.get("s_aux", kwargs.get("sinks"))  # GPT-OSS: its module.sinks, (H,)
    structured = None  # an attnlab Mask from the mask builder (`hf_masks`): no dense matrix
    if isinstance(attention_mask, Mask):
        structured, attention_mask = attention_mask, None
        if kwargs.get("position_bias") is not None:  # T5's bias joins one dense float mask
            L, S = query.shape[-2], key.shape[-2]
            attention_mask, structured = structured.to_dense(L, S, device=query.device), None
    causal = structured is None and _is_causal(module, is_causal, attention_mask,
                                               query.shape[-2])
    mask = attention_mask
    if kwargs.get("position_bias") is not None:
        mask, causal = _with_position_bias(kwargs["position_bias"], mask, causal), False
    if mask is not None and mask.is_floating_point() and mask.dtype != query.dtype:
        mask = mask.to(query.dtype)
    args = dict(attn_mask=mask, dropout_p=float(dropout or 0.0), is_causal=causal, scale=scaling,
                enable_gqa=key.shape[-3] != query.shape[-3], mask=structured)
    if kwargs.get("softcap") is not None:  # Gemma 2: softcap * tanh(scaled score / softcap)
        args["softcap"] = float(kwargs["softcap"])
    if sinks is not None:
        args["sinks"] = sinks
    layer = None if _is_cross(module) else getattr(module, "layer_idx", None)
    if not _wants_weights(kwargs):
        out = attention(query, key, value, **args)  # (B, H, L, Dv)
        out = interventions.apply(layer, out, value)  # an active intervention's edit, if any
        return out.transpose(1, 2).contiguous(), None  # -> (B, L, H, Dv)
    p = make_problem(query, key, value, args["attn_mask"], args["dropout_p"], causal, scaling,
                     args["enable_gqa"], mask=structured, softcap=args.get("softcap"),
                     sinks=sinks)
    if sinks is not None and recording.recording():
        raise AttnlabError("s_aux: a recording has no attention sinks (its steps are the "
                           "lesson's softmax); record a model without them")
    out, _, weights = run_with_weights(p, row_block=WEIGHT_ROWS)  # weights (B, H, L, S)
    out = interventions.apply(layer, out, value)
    if recording.recording():
        _record(module, query, key, value, _record_masks(p), weights, causal, args.get("softcap"))
    return out.transpose(1, 2).contiguous(), weights.to(query.dtype)


def _record_masks(p):
    """(allowed bool, bias float or None, scale) of a validated call for a recording, masks as
    (B, 1|H, L, S).

    The bias is what the op added to the scores where a pair may attend (T5's position bias, the
    finite part of a float mask), 0 elsewhere; None when nothing was added.
    """
    batch = p.query.shape[0]
    allowed, bias = p.dense_masks()
    if bias is not None:  # transformers' float masks use the dtype's min, not -inf
        keep = bias > torch.finfo(bias.dtype).min / 2
        allowed = keep if allowed is None else allowed & keep
        bias = torch.where(keep, bias, torch.zeros((), dtype=bias.dtype, device=bias.device))
        bias = _batched(bias, batch) if bias.any() else None
    if allowed is None:
        allowed = torch.ones(p.dims.L, p.dims.S, dtype=torch.bool, device=p.query.device)
    return _batched(allowed, batch), bias, p.scale


def _batched(mask: torch.Tensor, batch: int) -> torch.Tensor:
    while mask.dim() < 4:
        mask = mask[None]
    return mask.expand(batch, -1, -1, -1)  # (B, 1|H, L, S)


def _record(module, query, key, value, masks, weights, causal, softcap) -> None:
    allowed, bias, scale = masks
    groups = query.shape[-3] // key.shape[-3]
    k, v = key.detach().double().cpu(), value.detach().double().cpu()
    if groups > 1:
        k = k.repeat_interleave(groups, dim=-3)  # (B, Hkv, S, D) -> (B, H, S, D)
        v = v.repeat_interleave(groups, dim=-3)
    recording.add(recording.AttentionCall(
        layer=getattr(module, "layer_idx", None), query=query.detach().double().cpu(), key=k,
        value=v, allowed=allowed.detach().cpu(), weights=weights.detach().double().cpu(),
        scale=float(scale), causal=causal,
        bias=None if bias is None else bias.detach().double().cpu(), softcap=softcap,
        cross=_is_cross(module),
    ))


def _is_cross(module) -> bool:
    """Cross-attention, as far as the module says: GPT-2's is_cross_attention, BERT's (and its
    relatives') *CrossAttention classes."""
    flag = getattr(module, "is_cross_attention", None)
    return bool(flag) if flag is not None else type(module).__name__.endswith("CrossAttention")
