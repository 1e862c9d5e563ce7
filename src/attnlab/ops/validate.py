"""Validate one attention call once, into the Problem every backend and weights path receives.

`make_problem` is the op's public boundary: every argument is checked here (with AttnlabError
naming it), batch dims broadcast as in SDPA, SDPA's `attn_mask` loses its extra leading dims of
size 1 and `is_causal` folds into the structured mask, simplified for the call's L and S.
"""

from __future__ import annotations

import numpy as np
import torch

from attnlab.errors import (
    AttnlabError,
    broadcasts_to,
    check_dense_mask,
    check_dropout,
    check_qkv,
    check_scale,
    fmt_shape,
)
from attnlab.masks import Mask, causal
from attnlab.ops.problem import Problem


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
