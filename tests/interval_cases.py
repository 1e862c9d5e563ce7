"""Interval-attention test inputs and the formula they are checked against (shared by the
interval-kernel tests): per-row key intervals of every mask kind, written out by hand."""

from __future__ import annotations

import os
import shutil
import time

import pytest
import torch

from attnlab.ops import kernels


def isa_params():
    """Every ISA build; those this CPU cannot run are skipped, never failed."""
    here = kernels.runnable()
    return [pytest.param(i, marks=pytest.mark.skipif(i not in here, reason=f"CPU lacks {i}"))
            for i in kernels.ISAS]


def need_compiler():
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler: the kernel cannot be built here")


#: a helper keeps off its caller's CPU while it works (OffCpu, csrc/queue.h): Linux, 2 CPUs or more
OFF_CPU = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or not os.path.isdir("/proc/self/task")
    or len(os.sched_getaffinity(0)) < 2, reason="Linux with 2 CPUs or more")


def masks_left_changed(calls) -> dict:
    """The threads of this process whose CPU mask is not the process's after `calls` ran on two
    threads (each a kernel call whose helpers kept off their caller's CPU): {tid: mask}. PyTorch's
    pool threads serve other work too, so every helper puts its mask back."""
    cpus = os.sched_getaffinity(0)
    w, x = torch.randn(1024, 1024), torch.randn(64, 1024)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for _ in range(40):
            torch.nn.functional.linear(x, w)  # its OpenMP threads spin on the cores after it
            calls()
    finally:
        torch.set_num_threads(before)
    time.sleep(0.05)  # the last call's helper done
    masks = {t: os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")}
    return {t: m for t, m in masks.items() if m != cpus}


def intervals(kind: str, B: int, L: int, S: int):
    """int64 lo, hi (B, 1, L) of a mask kind, written from its definition."""
    i = torch.arange(L)
    lo, hi = torch.zeros(L, dtype=torch.int64), torch.full((L,), S)
    if kind in ("causal", "window", "prefix"):
        hi = (i + 1).clamp(max=S)
    if kind in ("causal_br", "window_br"):
        hi = (i + S - L + 1).clamp(0, S)
    if kind.startswith("window"):
        lo = (hi - 7).clamp(min=0)
    if kind == "prefix":
        hi = hi.clamp(min=min(5, S))
    lo, hi = lo.expand(B, 1, L).clone(), hi.expand(B, 1, L).clone()
    if kind == "document":  # documents of lengths 3, 40, rest (L == S)
        bounds = torch.tensor([0, 3, 43, S])
        seg = torch.bucketize(i, bounds[1:], right=True)
        lo[:], hi[:] = bounds[seg], bounds[seg + 1]
        hi[:] = torch.minimum(hi, i + 1)  # causal within each document
    if kind == "padding":  # batch element b has S - 3b real keys and L - 2b real queries
        for b in range(B):
            hi[b] = S - 3 * b
            hi[b, :, L - 2 * b:] = 0
    if kind == "empty_rows":
        hi[:, :, ::3] = 0
    if kind == "all_empty":
        hi[:] = 0
    return lo, hi


def formula(q, k, v, lo, hi, scale, softcap=None, slopes=None, pos_off=0):
    """(out, lse) from the definitions in q's dtype, autograd-able; rows with no key: 0, -inf."""
    G = q.shape[1] // k.shape[1]
    w, lse = weights(q, k, lo, hi, scale, softcap, slopes, pos_off)
    return w @ v.repeat_interleave(G, 1), lse


def weights(q, k, lo, hi, scale, softcap=None, slopes=None, pos_off=0):
    """(weights (B, H, L, S), lse (B, H, L)) from the definitions in q's dtype; rows with no key:
    0, -inf."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    s = q @ k.transpose(-1, -2) * scale  # (B, H, L, D) @ (B, H, D, S) -> (B, H, L, S)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    L, S = s.shape[-2:]
    if slopes is not None:
        rel = torch.arange(S)[None, :] - torch.arange(L)[:, None] + pos_off  # (L, S): j - i
        s = s + slopes.to(s.dtype).reshape(-1, q.shape[1], 1, 1) * rel.to(s.dtype)
    j = torch.arange(S)
    allowed = (j >= lo[..., None]) & (j < hi[..., None])  # (B|1, H|1, L, S)
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    alive = torch.isfinite(lse)
    return torch.exp(s - torch.where(alive, lse, 0)[..., None]), lse
