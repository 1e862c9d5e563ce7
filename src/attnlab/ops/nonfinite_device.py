"""NaN/Inf in keys and values on an accelerator: `ops.nonfinite`'s rule, without host syncs.

Same rule: a query row is NaN (output and lse) exactly when it may attend a key position whose key
or value holds a NaN or Inf; every other row is computed as if that position held zeros. The CPU
version first asks whether any poison is present (one reduction read back to the host) and skips
the work when there is none; here nothing is read back, so the cleaning always runs, as tensor ops
queued on the device:

- key and value are zeroed where poisoned (`torch.where`, one pass over each);
- the rows that may attend a poisoned position are found from the mask's per-row key intervals
  when it has them (a prefix count of poisoned keys, O(L) per head), else from the mask a band of
  rows at a time (one bool × poison matmul per band, BLOCK_ENTRIES mask entries at a time);
- those rows are set to NaN after the kernel.

Calls without any mask skip it, as on CPU: every row attends every key, so NaN reaches every row
through the kernel itself and cannot spread further.
"""

from __future__ import annotations

import dataclasses

import torch

from attnlab.ops.nonfinite import nan_rows
from attnlab.ops.problem import Problem

#: mask entries (rows × keys × mask batch·heads) evaluated at a time when a mask has no intervals
BLOCK_ENTRIES = 1 << 26


def clean(p: Problem) -> tuple[Problem, torch.Tensor | None]:
    """(p with poisoned key/value positions zeroed, bad bool (..., Hkv, S)) or (p, None)."""
    if p.structured is None and p.attn_mask is None:
        return p, None
    bad = ~(torch.isfinite(p.key.detach()).all(-1) & torch.isfinite(p.value.detach()).all(-1))
    zero = torch.zeros((), dtype=p.key.dtype, device=p.key.device)
    key = torch.where(bad[..., None], zero, p.key)  # (..., Hkv, S, D)
    value = torch.where(bad[..., None], zero, p.value)  # (..., Hkv, S, Dv)
    return dataclasses.replace(p, key=key, value=value, finite=True), bad


def poison(p: Problem, bad: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None):
    """out, lse with NaN in every row that may attend a position of `bad` (..., Hkv, S)."""
    return nan_rows(poisoned_rows(p, bad), out, lse)


def poisoned_rows(p: Problem, bad: torch.Tensor) -> torch.Tensor:
    """bool (..., H, L): rows that may attend some position marked in bad (..., Hkv, S)."""
    d = p.dims
    if d.ndim > 2 and d.groups > 1:
        bad = bad.repeat_interleave(d.groups, dim=-2)  # (..., Hkv, S) -> (..., H, S)
    iv = _intervals(p)
    if iv is not None:
        lo, hi = iv  # (Bm|1, Hm|1, L) int32 each
        count = torch.nn.functional.pad(bad.to(torch.int32).cumsum(-1), (1, 0))  # (..., H, S+1)
        lead = count.shape[:-1]
        lo, hi = _fit(lo, lead, d.L), _fit(hi, lead, d.L)  # (..., H, L)
        return (count.gather(-1, hi) - count.gather(-1, lo)) > 0  # (..., H, L)
    hit = []
    n = max(1, p.structured.batch_size * p.structured.heads if p.structured else 1)
    band = max(1, BLOCK_ENTRIES // max(1, n * d.S))
    badf = bad.to(torch.float32)[..., None]  # (..., H, S, 1): counts exact below 2**24
    for r0 in range(0, d.L, band):
        rows = torch.arange(r0, min(d.L, r0 + band), device=bad.device)
        allowed = p.allowed_at(rows=rows)  # (..., H|1, R, S) or None: every key
        if allowed is None:
            hit.append(bad.any(-1, keepdim=True).expand(*bad.shape[:-1], rows.numel()))
            continue
        hits = allowed.to(torch.float32) @ badf  # (.., H|1, R, S) @ (.., H, S, 1) -> (.., R, 1)
        hit.append(hits[..., 0] > 0)
    return torch.cat(hit, dim=-1)  # (..., H, L)


def _fit(x: torch.Tensor, lead, L: int) -> torch.Tensor:
    """(Bm|1, Hm|1, L) int32 as int64 (*lead, L); leading 1s dropped for calls with fewer dims."""
    x = x.long()
    while x.dim() > len(lead) + 1:
        x = x[0]
    return x.expand(*lead, L)


def _intervals(p: Problem):
    """The structured mask's per-row key intervals when it alone masks the call and is one batch
    element wide (or the batch is one dim), else None. They depend on the mask and the shape
    only: computed once on the host from the mask's own tensors, kept with the mask, and copied
    to the device (some kinds find their intervals with searches that would sync a device)."""
    m = p.structured
    if p.attn_mask is not None or m is None:
        return None
    if m.batch_size > 1 and len(p.dims.batch) != 1:
        return None
    return m.intervals_copied(p.dims.L, p.dims.S, p.query.device)
