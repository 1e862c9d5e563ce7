"""NaN/Inf in keys and values: one answer for every backend.

Rule: a query row is NaN (output and lse) exactly when it may attend a key position whose key
or value holds a NaN or Inf; every other row is computed as if that position held zeros. So
poison in a position no row attends never shows, and poison a row does attend reaches that row
and no other, whatever the backend, tile size or kernel.

Kernels alone would not give this: a masked score is NaN + (-inf) = NaN in a fused kernel, and
a zero weight times a NaN value is NaN in any matmul, so one poisoned key spreads to every row
that shares its tile or its matmul. Instead the positions are zeroed before the kernel runs and
the rows that may attend them are set to NaN after it.

Cost: one reduction over key and value per call (two more passes only when poison is present).
Calls without any mask skip it: every row attends every key there, so nothing can spread.
"""

from __future__ import annotations

import dataclasses

import torch

from attnlab.ops.problem import Problem

#: entries of one (rows × poisoned columns) mask block evaluated at a time
BLOCK_ENTRIES = 1 << 24


def all_finite(x: torch.Tensor) -> bool:
    """No NaN/Inf in x, from one reduction (an overflowing sum only costs the exact check)."""
    return bool(torch.isfinite(x.detach().sum()))


def clean(p: Problem) -> tuple[Problem, torch.Tensor | None]:
    """(p with poisoned key/value positions zeroed, bad bool (..., Hkv, S) or None)."""
    if p.structured is None and p.attn_mask is None:
        return p, None
    if p.key.numel() == 0 or p.value.numel() == 0 or p.query.numel() == 0:
        return p, None
    if all_finite(p.key) and all_finite(p.value):
        return dataclasses.replace(p, finite=True), None
    bad = ~(torch.isfinite(p.key.detach()).all(-1) & torch.isfinite(p.value.detach()).all(-1))
    if not bool(bad.any()):
        return dataclasses.replace(p, finite=True), None
    zero = torch.zeros((), dtype=p.key.dtype, device=p.key.device)
    key = torch.where(bad[..., None], zero, p.key)  # (..., Hkv, S, D)
    value = torch.where(bad[..., None], zero, p.value)
    return dataclasses.replace(p, key=key, value=value, finite=True), bad


def poison(p: Problem, bad: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None):
    """out, lse with NaN in every row that may attend a position of `bad` (..., Hkv, S)."""
    rows = poisoned_rows(p, bad)  # bool, broadcastable to (..., H, L)
    nan = torch.tensor(float("nan"), dtype=out.dtype, device=out.device)
    out = torch.where(rows[..., None], nan, out)
    if lse is not None:
        lse = torch.where(rows, float("nan"), lse)
    return out, lse


def poisoned_rows(p: Problem, bad: torch.Tensor) -> torch.Tensor:
    """bool (..., H, L): rows that may attend some position marked in bad (..., Hkv, S)."""
    d = p.dims
    if d.ndim > 2 and d.groups > 1:
        bad = bad.repeat_interleave(d.groups, dim=-2)  # (..., Hkv, S) -> (..., H, S)
    cols = bad.reshape(-1, d.S).any(0).nonzero().squeeze(1)  # poisoned somewhere, ascending
    hit = torch.zeros(*bad.shape[:-1], d.L, dtype=torch.bool, device=bad.device)  # (..., H, L)
    step = max(1, BLOCK_ENTRIES // max(1, hit.numel()))
    for c0 in range(0, cols.numel(), step):
        c = cols[c0:c0 + step]
        allowed = p.allowed_at(cols=c)  # (..., H|1, L|1, nc) or None: every pair may attend
        b = bad[..., None, :].index_select(-1, c)  # (..., H, 1, nc)
        hit |= (b if allowed is None else allowed & b).any(-1)
    return hit
