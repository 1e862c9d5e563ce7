"""attnlab.attention: a drop-in for torch.nn.functional.scaled_dot_product_attention."""

from __future__ import annotations

import numpy as np
import torch

from attnlab.errors import (
    AttnlabError,
    broadcasts_to,
    check_choice,
    check_dense_mask,
    check_dropout,
    check_qkv,
    check_scale,
    fmt_shape,
)
from attnlab.masks import Mask, causal
from attnlab.ops import dispatch
from attnlab.ops.problem import Problem


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    mask: Mask | None = None,
    return_lse: bool = False,
    backend: str = "auto",
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
):
    """Scaled dot-product attention: softmax(query · keyᵀ · scale + mask) · value.

    Takes `torch.nn.functional.scaled_dot_product_attention`'s arguments with the same meaning:

    Args:
        query: (..., H, L, D).
        key: (..., Hkv, S, D); Hkv = H unless `enable_gqa`.
        value: (..., Hkv, S, Dv).
        attn_mask: bool (True = may attend) or float (added to the scaled scores), broadcastable
            to (..., H, L, S).
        dropout_p: probability of dropping an attention weight (survivors scaled by 1/(1-p)).
        is_causal: top-left aligned causal mask (query i sees keys j <= i), as SDPA.
        scale: multiplies the scores; default 1/sqrt(D).
        enable_gqa: grouped-query attention, H a multiple of Hkv; query head h uses k/v head
            h // (H / Hkv).

    Keyword-only extras:
        mask: a structured mask from `attnlab.masks` (causal(align=...), sliding_window, padding,
            document, prefix_lm, from_dense, and their & | ~ combinations).
        return_lse: also return the log-sum-exp of each query row, (..., H, L), float32 for
            fp16/bf16 inputs.
        backend: "auto" (fastest exact path; see `attnlab.select_backend`), "sdpa", "math",
            "tiled" (online softmax over tiles, skips masked-out tiles, memory linear in L), or
            "reference" (NumPy float64, no autograd).
        softcap: tanh soft-capping of the scaled scores, softcap · tanh(s / softcap) (Gemma 2),
            applied before any bias or mask.
        alibi_slopes: (H,) ALiBi slopes; adds slope_h · (j - i) to head h's scores. Only the
            lse depends on the diagonal's alignment; the output does not.

    All masks given (attn_mask, is_causal, mask) apply together: a pair may attend only if every
    one allows it. A query row that may attend to nothing gets output 0 and lse -inf, never NaN;
    NaN/Inf in a key or value that no query may attend never reaches the output.

    Returns:
        out (..., H, L, Dv) in the input dtype, or (out, lse) with `return_lse=True`.

    Raises:
        AttnlabError: on bad input, naming the argument and showing the shapes.
    """
    p = make_problem(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                     mask=mask, softcap=softcap, alibi_slopes=alibi_slopes)
    check_choice("backend", backend, dispatch.BACKENDS)
    out, lse = dispatch.run(backend, p, need_lse=return_lse)
    return (out, lse) if return_lse else out


def select_backend(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False, *, mask=None, return_lse=False, softcap=None,
                   alibi_slopes=None) -> dispatch.Choice:
    """Which backend `attention(..., backend="auto")` would run for these inputs, and why."""
    p = make_problem(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                     mask=mask, softcap=softcap, alibi_slopes=alibi_slopes)
    return dispatch.choose(p, need_lse=return_lse)


def make_problem(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, *,
                 mask, softcap=None, alibi_slopes=None) -> Problem:
    """Validate a call once and fold its masks together."""
    dims = check_qkv(query, key, value, enable_gqa=bool(enable_gqa))
    if dims.ndim > 2:  # SDPA broadcasts batch dims (a key/value batch of 1 serves all): views
        query, key = (x.expand(*dims.batch, *x.shape[-3:]) for x in (query, key))
        value = key if value is None else value.expand(*dims.batch, *value.shape[-3:])
    if attn_mask is not None:
        check_dense_mask("attn_mask", attn_mask, dims, query.device)
        if attn_mask.dim() < 2:  # (S,) or a scalar: one row broadcast over every query
            attn_mask = attn_mask.reshape(1, -1)
        while attn_mask.dim() > len(dims.scores_shape):  # extra leading dims are 1 (checked)
            attn_mask = attn_mask[0]
    structured = _structured(mask, is_causal, dims)
    return Problem(
        query=query, key=key, value=value, dims=dims,
        scale=check_scale(scale, dims.D), dropout_p=check_dropout(dropout_p),
        structured=structured, attn_mask=attn_mask,
        softcap=check_softcap(softcap), alibi_slopes=check_alibi(alibi_slopes, dims, query.device),
    )


def check_softcap(softcap) -> float | None:
    if softcap is None:
        return None
    try:
        c = float(softcap)
    except (TypeError, ValueError):
        c = float("nan")
    if not (c > 0 and c != float("inf")):
        raise AttnlabError(f"softcap: expected a positive finite number or None, got {softcap!r}")
    return c


def check_alibi(slopes, dims, device) -> torch.Tensor | None:
    if slopes is None:
        return None
    if not isinstance(slopes, torch.Tensor) or not slopes.is_floating_point():
        raise AttnlabError(
            f"alibi_slopes: expected a float tensor of shape (H,) = ({dims.H},), got "
            f"{type(slopes).__name__} {getattr(slopes, 'dtype', '')}".rstrip()
        )
    if tuple(slopes.shape) != (dims.H,):
        raise AttnlabError(
            f"alibi_slopes: expected shape (H,) = ({dims.H},), got {fmt_shape(slopes.shape)}"
        )
    if slopes.device != device:
        raise AttnlabError(
            f"alibi_slopes: expected device {device} like query, got {slopes.device}"
        )
    return slopes


def _structured(mask, is_causal, dims) -> Mask | None:
    if mask is not None:
        if not isinstance(mask, Mask):
            raise AttnlabError(
                f"mask: expected a mask from attnlab.masks, got {type(mask).__name__}; "
                "pass dense tensors as attn_mask="
            )
        mask.check(dims.L, dims.S)
        mshape = (mask.batch_size, mask.heads, dims.L, dims.S)
        if not broadcasts_to(mshape, dims.scores_shape):
            raise AttnlabError(
                f"mask: {mask!r} covers (Bm, Hm, L, S) = {fmt_shape(mshape)}, which does not "
                f"broadcast to the scores (..., H, L, S) = {fmt_shape(dims.scores_shape)}"
            )
    if isinstance(is_causal, np.bool_):  # what SDPA accepts, e.g. from a NumPy config
        is_causal = bool(is_causal)
    if not isinstance(is_causal, bool):
        raise AttnlabError(f"is_causal: expected a bool, got {is_causal!r}")
    if is_causal:
        mask = causal() if mask is None else causal() & mask
    return None if mask is None else mask.simplified(dims.L, dims.S)
