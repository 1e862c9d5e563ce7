"""Validate one attention call once, into the Problem every backend and weights path receives.

`make_problem` is the op's public boundary: every argument is checked here (with AttnlabError
naming it), batch dims broadcast as in SDPA, SDPA's `attn_mask` loses its extra leading dims of
size 1 and `is_causal` folds into the structured mask, simplified for the call's L and S.
The checks of the three inputs against each other (`check_qkv`, which context-parallel attention
reuses) and of a dense mask (`check_dense_mask`) are below it.
"""

from __future__ import annotations

import numpy as np
import torch

from attnlab.errors import (
    AttnlabError,
    broadcasts_to,
    check_dropout,
    check_scale,
    check_slopes,
    check_softcap,
    fmt_shape,
)
from attnlab.masks import Mask, causal
from attnlab.ops.problem import Dims, Problem


def make_problem(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, *,
                 mask, softcap=None, alibi_slopes=None, score_mod=None, sinks=None) -> Problem:
    """Validate a call once and fold its masks together."""
    dims = check_qkv(query, key, value, enable_gqa=bool(enable_gqa))
    if dims.ndim > 2:  # SDPA broadcasts batch dims (a key/value batch of 1 serves all): views
        query, key = (_to_batch(x, dims.batch) for x in (query, key))
        value = key if value is None else _to_batch(value, dims.batch)
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
        score_mod=check_score_mod(score_mod, dims, query.device),
        sinks=check_sinks(sinks, dims, query.device),
    )


def _to_batch(x: torch.Tensor, batch: tuple[int, ...]) -> torch.Tensor:
    """x (..., h, n, m) with its batch dims expanded to `batch` (x itself when they are)."""
    return x if x.shape[:-3] == batch else x.expand(*batch, *x.shape[-3:])


def check_score_mod(fn, dims, device):
    """A score_mod bound to this call: a modifier with `bind(dims, device)` (masks.alibi) is
    bound to its lengths and device; any other callable, on the CPU, runs in the form that
    gives Flex's answer (`attnlab.flexfn`: broadcast, or vmap for scalar-only functions)."""
    if fn is None:
        return None
    if not callable(fn):
        raise AttnlabError(
            f"score_mod: expected a callable score_mod(score, b, h, q_idx, kv_idx), got "
            f"{type(fn).__name__}")
    bind = getattr(fn, "bind", None)
    if callable(bind):
        return bind(dims, device)
    if torch.device(device).type != "cpu":  # Flex's device kernels call it on scalars
        return fn
    from attnlab.flexfn import adapt

    return adapt(fn, score=True)  # broadcast where it broadcasts, else vmap, as Flex


def check_alibi(slopes, dims, device) -> torch.Tensor | None:
    """alibi_slopes: None, or finite float slopes (H,) on query's device."""
    return None if slopes is None else check_slopes("alibi_slopes", slopes, dims.H, device=device)


def check_sinks(sinks, dims, device) -> torch.Tensor | None:
    """sinks: None, or finite float logits (H,), one per query head, on query's device."""
    return None if sinks is None else check_slopes("sinks", sinks, dims.H, device=device)


#: is_causal=True as a mask: one object, so the intervals kept with it serve every such call
_CAUSAL = causal()


def _structured(mask, is_causal, dims) -> Mask | None:
    if mask is not None:
        if not isinstance(mask, Mask):
            raise AttnlabError(
                f"mask: expected a mask from attnlab.masks, got {type(mask).__name__}; "
                "pass dense tensors as attn_mask="
            )
        # a mask function reading b or h is evaluated at this call's batch and heads (the mask's
        # batch dim lines up with the last batch dim)
        mask = mask.for_call(dims.batch[-1] if dims.batch else 1, dims.H if dims.ndim > 2 else 1)
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
        mask = _CAUSAL if mask is None else _CAUSAL & mask
    return None if mask is None else mask.simplified(dims.L, dims.S)


def _check_tensor(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise AttnlabError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise AttnlabError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < 2:
        raise AttnlabError(
            f"{name}: expected at least 2 dims (..., L, D), got shape {fmt_shape(x.shape)}"
        )


def check_qkv(query, key, value, *, enable_gqa: bool) -> Dims:
    """Check the three inputs against each other and return their sizes.

    `value=None` checks query and key only (the messages then name only those two). Leading
    batch dims broadcast as in SDPA (a key/value batch of 1 serves every query batch element);
    `Dims.batch` is the broadcast batch.
    """
    given = [("query", query), ("key", key)] + ([("value", value)] if value is not None else [])
    names = ", ".join(n for n, _ in given)
    for name, x in given:
        _check_tensor(name, x)
    if len({x.dim() for _, x in given}) > 1:
        raise AttnlabError(
            f"{names}: expected the same number of dims, got "
            + ", ".join(fmt_shape(x.shape) for _, x in given)
        )
    if len({x.dtype for _, x in given}) > 1:
        raise AttnlabError(f"{names}: expected one dtype, got "
                           + ", ".join(str(x.dtype) for _, x in given))
    if len({x.device for _, x in given}) > 1:
        raise AttnlabError(f"{names}: expected one device, got "
                           + ", ".join(str(x.device) for _, x in given))
    if query.device.type == "meta":
        raise AttnlabError(
            f"{names}: meta tensors hold no values to attend over; pass tensors on a real device"
        )
    value = key if value is None else value
    nd = query.dim()
    L, D = query.shape[-2:]
    S, Dv = key.shape[-2], value.shape[-1]
    if nd == 2:
        qb, H, Hkv = (), 1, 1
    else:
        qb, H, Hkv = tuple(query.shape[:-3]), query.shape[-3], key.shape[-3]
    batch = _broadcast(qb, tuple(key.shape[:-3]))
    head = ("B", "Hkv") if nd > 3 else ("Hkv",) if nd == 3 else ()
    want_k = (*qb, Hkv, S, D) if nd > 2 else (S, D)
    if batch is None or tuple(key.shape[-1:]) != (D,):
        names_k = "(" + ", ".join([*head, "S", "D"]) + ")" if nd <= 4 else "(..., Hkv, S, D)"
        also = f" and value {fmt_shape(value.shape)}" if len(given) == 3 else ""
        raise AttnlabError(
            f"key: expected {names_k} = {fmt_shape(want_k)} to match query "
            f"{fmt_shape(query.shape)}{also}, got {fmt_shape(key.shape)}"
        )
    want_v = (*qb, Hkv, S, Dv) if nd > 2 else (S, Dv)
    batch = _broadcast(batch, tuple(value.shape[:-3]))
    heads_len = 2 if nd > 2 else 1  # (Hkv, S) or (S,)
    if batch is None or tuple(value.shape[-1 - heads_len:-1]) != want_v[-1 - heads_len:-1]:
        raise AttnlabError(
            f"value: expected leading dims {fmt_shape(want_v[:-1])} to match key "
            f"{fmt_shape(key.shape)}, got {fmt_shape(value.shape)}"
        )
    if Hkv != H:
        if not enable_gqa:
            raise AttnlabError(
                f"key: has {Hkv} heads but query has {H} (query {fmt_shape(query.shape)}, key "
                f"{fmt_shape(key.shape)}); pass enable_gqa=True for grouped-query attention"
            )
        if Hkv == 0 or H % Hkv != 0:
            raise AttnlabError(
                f"enable_gqa: query heads H={H} must be a multiple of key/value heads Hkv={Hkv} "
                f"(query {fmt_shape(query.shape)}, key {fmt_shape(key.shape)})"
            )
    return Dims(batch=tuple(batch), H=H, Hkv=Hkv, L=L, S=S, D=D, Dv=Dv, ndim=nd)


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast of two batch shapes of equal length, or None when they don't broadcast."""
    if len(a) != len(b) or any(x != y and 1 not in (x, y) for x, y in zip(a, b)):
        return None
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def check_dense_mask(name: str, mask, dims: Dims, device) -> None:
    if not isinstance(mask, torch.Tensor):
        raise AttnlabError(f"{name}: expected a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise AttnlabError(f"{name}: expected a bool or floating-point tensor, got {mask.dtype}")
    if mask.device != device:
        raise AttnlabError(f"{name}: expected device {device} like query, got {mask.device}")
    if not broadcasts_to(tuple(mask.shape), dims.scores_shape):
        raise AttnlabError(
            f"{name}: shape {fmt_shape(mask.shape)} does not broadcast to the scores "
            f"(..., H, L, S) = {fmt_shape(dims.scores_shape)}"
        )
