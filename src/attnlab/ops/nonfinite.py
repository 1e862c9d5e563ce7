"""NaN/Inf in keys and values: one answer for every backend.

Rule: a query row is NaN (output and lse) exactly when it may attend a key position whose key
or value holds a NaN or Inf; every other row is computed as if that position held zeros. So
poison in a position no row attends never shows, and poison a row does attend reaches that row
and no other, whatever the backend, tile size or kernel. A query row that itself holds a NaN or
Inf is NaN when it may attend anything (a row with nothing to attend stays 0 / lse −inf): the
fused CPU kernel alone returns such a row as 0 with a finite lse at some sizes.

Kernels alone would not give this: a masked score is NaN + (-inf) = NaN in a fused kernel, and
a zero weight times a NaN value is NaN in any matmul, so one poisoned key spreads to every row
that shares its tile or its matmul. Instead the positions are zeroed before the kernel runs and
the rows that may attend them are set to NaN after it.

Cost: one reduction over query, key and value per call (more passes only when poison is
present). Calls without any mask skip the key/value part: every row attends every key there, so
nothing can spread, and the row is not finite through plain arithmetic (`clean(...,
always=True)` cleans them anyway: a context-parallel block that is one piece of a masked call,
and the compiled kernels, whose running max passes over a NaN score). The interval kernel
needs no such pass: it checks every key as it transposes them and each query and value row
as it reads them (`dispatch.run`); only when it finds NaN/Inf are the inputs cleaned here and
the call made again.
"""

from __future__ import annotations

import dataclasses

import torch

from attnlab.ops.problem import Problem

#: entries of one (rows × poisoned columns) mask block evaluated at a time
BLOCK_ENTRIES = 1 << 24


#: float32 CPU tensors this large are checked by the compiled kernel's `all_finite` once loaded
KERNEL_CHECK_MIN = 1 << 15


def all_finite(x: torch.Tensor) -> bool:
    """No NaN/Inf in x, from one reduction (an overflowing sum only costs the exact check).

    A large float32 CPU tensor is checked by the interval kernel once it is loaded: on its own
    work queue, since the threads of a PyTorch (OpenMP) reduction keep spinning after it and, on
    a busy machine, take the cores from the kernel's threads that run next."""
    x = x.detach()
    if (x.device.type == "cpu" and x.dtype == torch.float32 and x.numel() >= KERNEL_CHECK_MIN
            and x.is_contiguous()):
        from attnlab.ops.kernels import build

        ops = build.loaded()
        if ops is not None:
            return bool(ops.all_finite(x))
    return bool(torch.isfinite(x.sum()))


def clean(p: Problem, *, always: bool = False) -> tuple[Problem, torch.Tensor | None]:
    """(p with poisoned key/value positions zeroed, bad bool (..., Hkv, S) or None).

    always: clean even a call without any mask (see the module docstring)."""
    if p.structured is None and p.attn_mask is None and not always:
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


def clean_queries(p: Problem) -> tuple[Problem, torch.Tensor | None]:
    """(p with query rows holding NaN/Inf zeroed, bad_q bool (..., H, L) or None)."""
    if p.query.numel() == 0 or all_finite(p.query):
        return p, None
    bad = ~torch.isfinite(p.query.detach()).all(-1)  # (..., H, L)
    zero = torch.zeros((), dtype=p.query.dtype, device=p.query.device)
    return dataclasses.replace(p, query=torch.where(bad[..., None], zero, p.query)), bad


def poison_queries(p: Problem, bad_q: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor | None):
    """out, lse with NaN in every row of `bad_q` (..., H, L) that may attend some key."""
    return nan_rows(bad_q & live_rows(p, bad_q), out, lse)


def live_rows(p: Problem, bad_q: torch.Tensor) -> torch.Tensor:
    """bool broadcastable to (..., H, L): True for the rows of `bad_q` that may attend some key
    (the others need not be evaluated: only they are asked)."""
    rows = bad_q.reshape(-1, p.dims.L).any(0).nonzero().squeeze(1)  # bad somewhere, ascending
    if p.structured is None and p.attn_mask is None:
        return torch.ones((), dtype=torch.bool, device=bad_q.device)
    live = torch.zeros(bad_q.shape, dtype=torch.bool, device=bad_q.device)  # (..., H, L)
    step = max(1, BLOCK_ENTRIES // max(1, p.dims.S * max(1, live.numel() // p.dims.L)))
    for r0 in range(0, rows.numel(), step):
        r = rows[r0:r0 + step]
        allowed = p.allowed_at(rows=r)  # (..., H|1, nr, S)
        live[..., r] |= allowed.any(-1)
    return live


def poison(p: Problem, bad: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None):
    """out, lse with NaN in every row that may attend a position of `bad` (..., Hkv, S)."""
    return nan_rows(poisoned_rows(p, bad), out, lse)


def nan_rows(rows: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None):
    """out, lse with NaN in the rows marked in `rows` (bool, broadcastable to (..., H, L))."""
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
