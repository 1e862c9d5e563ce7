"""attnlab.attention_weights: exact rows of the attention matrix, recomputed from the saved lse.

A fast kernel never stores the (L, S) weights, but it can return the log-sum-exp of each query row.
With it, any row of the weights is one dot-product pass away: w[i, j] = exp(s[i, j] - lse[i]),
where s is the score of the one score pipeline (`ops.scores`: scaled, modified, masked). Only the
requested rows are computed, and only the keys some requested row may attend are scored (a sliding
window row scores its window), so one row of a 64k-token attention costs one short score row per
head.

On an interval-shaped call (no mask, or a structured mask whose rows each attend one key
interval; float32, float16 or bfloat16 on the CPU; no score_mod) the rows come from one op of the
compiled interval kernel (`kernels.runner.weights`), which scores only those intervals.

`rows_of(problem, lse, rows)` is the internal entry: it takes a Problem already validated (its
scale and masks, as the attention call used them), so a call that wants its output and weights
(`ops.api.attention_with_weights`) validates once.

Caution: these are the weights before dropout (dropout is random; the expectation is these).
"""

from __future__ import annotations

import array

import torch

from attnlab.errors import AttnlabError, fmt_shape
from attnlab.ops import budget, scores
from attnlab.ops.kernels import runner
from attnlab.ops.problem import Problem
from attnlab.ops.validate import make_problem


def attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    lse: torch.Tensor,
    rows=None,
    mask=None,
    scale: float | None = None,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    enable_gqa: bool = False,
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    score_mod=None,
) -> torch.Tensor:
    """Rows of softmax(query · keyᵀ · scale + mask), exactly, from the lse of `attention`.

    Args:
        query: (..., H, L, D), as given to `attnlab.attention`.
        key: (..., Hkv, S, D).
        lse: (..., H, L), the log-sum-exp the attention call returned (with `sinks=` it
            includes them, and so the weights are the sink's: no sinks argument needed here).
        rows: which query rows: None (all), an int, a slice, or a sequence/1-D tensor of ints.
        mask, scale, attn_mask, is_causal, enable_gqa, softcap, alibi_slopes, score_mod: exactly
            as passed to
            the attention call (the weights are only right for the same masks and modifiers).

    Returns:
        (..., H, R, S) weights in the accumulation dtype (float32 for fp16/bf16), R = len(rows);
        each row sums to 1, a row with nothing to attend is all 0.
    """
    p = make_problem(query, key, None, attn_mask, 0.0, is_causal, scale, enable_gqa, mask=mask,
                     softcap=softcap, alibi_slopes=alibi_slopes, score_mod=score_mod)
    check_lse(p, lse, query)
    return rows_of(p, lse, row_indices(rows, p.dims.L, p.query.device))


def check_lse(p: Problem, lse, query) -> None:
    want = tuple(p.query.shape[:-1])  # query's (..., H, L), batch broadcast with key's
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != want:
        got = fmt_shape(lse.shape) if isinstance(lse, torch.Tensor) else type(lse).__name__
        raise AttnlabError(
            f"lse: expected (..., H, L) = {fmt_shape(want)} like query "
            f"{fmt_shape(query.shape)}, got {got}"
        )


def rows_of(p: Problem, lse: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """(..., H, R, S) weights of the query rows idx (R,) int64 in [0, L), from the call's lse
    (..., H, L): the internal entry for a Problem already validated (value is not read)."""
    d, query = p.dims, p.query
    acc = scores.accum_dtype(query.dtype)
    R = idx.numel()
    shape = (*d.scores_shape[:-2], R, d.S)
    budget.check("rows", f"attention_weights for {R} rows", shape,
                 budget.entries(shape) * (3 * acc.itemsize + 1),
                 "ask for fewer rows at a time, e.g. rows=slice(0, 1024)")
    if budget.entries(shape) == 0:
        return torch.zeros(shape, dtype=acc, device=query.device)  # nothing to weigh
    if p.score_mod is None and runner.applies(p):  # interval-shaped: the compiled kernel
        return runner.weights(p, lse, idx)  # (..., H, R, S)
    allowed = _allowed(p, idx)  # (..., H|1, R, S) or None: every key
    keys, allowed = _needed_keys(allowed, d.S)  # slice(c0, c1) or (S',) indices; allowed too
    every = isinstance(keys, slice) and keys == slice(None)
    k = p.key[..., keys, :] if isinstance(keys, slice) else p.key.index_select(-2, keys)
    q = query.index_select(-2, idx).to(acc)  # (..., H, R, D)
    if d.ndim > 2:  # stack grouped heads along the rows: k is never repeated
        q = q.reshape(*d.batch, d.Hkv, d.groups * R, d.D)  # (..., H, R, D) -> (..., Hkv, G·R, D)
    s = scores.product(q, k.to(acc), p.scale)  # (.., Hkv, G·R, D) @ (.., Hkv, D, S') -> (.., S')
    if d.ndim > 2:
        s = s.reshape(*d.batch, d.H, R, -1)  # (..., Hkv, G·R, S') -> (..., H, R, S')
    cols = None  # (S',) global key positions, for ALiBi, a score_mod and a float attn_mask
    if p.has_modifiers or p.bias_at() is not None:
        every_col = torch.arange(d.S, device=idx.device)
        cols = keys if isinstance(keys, torch.Tensor) else every_col[keys]
    if p.score_mod is not None:
        s4 = s.reshape(-1, d.H if d.ndim > 2 else 1, R, s.shape[-1])  # (..., H, R, S') -> 4-D
        s = scores.apply_score_mod(p.score_mod, s4, idx, cols).reshape(s.shape)
    s, _ = scores.modify(s, softcap=p.softcap,
                         slopes=scores.head_slopes(p.alibi_slopes, d.ndim, acc), rows=idx,
                         cols=cols, bias=p.bias_at(idx, None if every else cols),
                         allowed=allowed)
    l = scores.lse_for_exp(lse.index_select(-1, idx).to(acc)).unsqueeze(-1)  # (..., H, R, 1)
    w = torch.exp(s - l)  # (..., H, R, S')
    if every:
        return w
    out = w.new_zeros(*w.shape[:-1], d.S)  # keys no requested row attends: weight exactly 0
    if isinstance(keys, slice):
        out[..., keys] = w
        return out
    return out.index_copy_(-1, keys, w)


def _allowed(p: Problem, idx: torch.Tensor) -> torch.Tensor | None:
    """bool mask of the requested rows, broadcastable to (..., H, R, S); None: every pair."""
    return p.allowed_at(rows=idx)


def _needed_keys(allowed: torch.Tensor | None, S: int):
    """(keys, allowed at those keys): the key columns some requested row may attend, as a slice
    (c0, c1) when they form one range (a view of k, no copy), else as an index tensor when that
    skips at least half of them; slice(None) for all of them."""
    if allowed is None or allowed.shape[-1] != S:  # no mask, or one broadcast over the keys
        return slice(None), allowed
    alive = allowed.reshape(-1, S).any(0)  # (S,)
    nz = alive.nonzero()  # (n, 1), ascending
    n = nz.shape[0]
    if n == 0:
        return slice(0, 0), allowed[..., :0]
    c0, c1 = int(nz[0, 0]), int(nz[-1, 0]) + 1
    if c1 - c0 == n or 2 * n >= S:  # one range, or too many keys for a gather to pay
        if c1 - c0 == S:
            return slice(None), allowed
        return slice(c0, c1), allowed[..., c0:c1]
    cols = nz[:, 0]
    return cols, allowed.index_select(-1, cols)


def row_indices(rows, L: int, device: torch.device) -> torch.Tensor:
    """int64 (R,) row indices in [0, L) from None, an int, a slice or a 1-D sequence of ints."""
    if rows is None:
        return torch.arange(L, device=device)
    if isinstance(rows, slice):
        return torch.arange(L, device=device)[rows]
    if type(rows) is int or (type(rows) in (list, tuple) and all(type(r) is int for r in rows)):
        ints = [rows] if type(rows) is int else list(rows)  # plain ints: checked without torch
        if any(not -L <= r < L for r in ints):
            raise AttnlabError(f"rows: indices must lie in [-{L}, {L}), got {ints}"[:200])
        if not ints:
            return torch.zeros(0, dtype=torch.int64, device=device)
        # through a buffer: a third of torch.tensor(list)'s cost on a cold call (no inference)
        t = torch.frombuffer(array.array("q", [r + L if r < 0 else r for r in ints]),
                             dtype=torch.int64)
        return t if device.type == "cpu" else t.to(device)
    what = "rows: expected an int, a slice or a 1-D sequence of ints"
    if isinstance(rows, (bool, str, bytes, set, frozenset, dict, float)):
        raise AttnlabError(f"{what}, got {type(rows).__name__} {rows!r}"[:200])
    if isinstance(rows, (list, tuple)) and len(rows) == 0:
        return torch.zeros(0, dtype=torch.int64, device=device)  # no rows: an empty result
    try:
        t = torch.as_tensor(rows, device=device)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise AttnlabError(f"{what}, got {rows!r}"[:200]) from None
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool or t.dim() > 1:
        raise AttnlabError(f"{what}, got {rows!r}"[:200])
    t = t.reshape(-1).to(torch.int64)  # () or (R,) -> (R,)
    if t.numel() and (int(t.min()) < -L or int(t.max()) >= L):
        raise AttnlabError(f"rows: indices must lie in [-{L}, {L}), got {t.tolist()}"[:200])
    return torch.where(t < 0, t + L, t)
