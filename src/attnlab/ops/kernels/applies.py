"""Whether a compiled kernel (backend "interval" or "decode") can run a validated call, and if
not, why: one answer for both, as the error message a forced backend raises (naming the argument
first), None when it can run. Both kernels take the same calls: no score_mod, CPU, float32,
float16 or bfloat16, no dropout, no dense attn_mask, every query row one key interval, the
kernel not turned off and available."""

from __future__ import annotations

import torch

from attnlab.ops.kernels import gate, runner
from attnlab.ops.problem import Problem


def why_not(p: Problem, backend: str) -> str | None:
    """Why backend `backend` ("interval", "decode") cannot run this call (None: it can);
    answered once per Problem and backend (the dispatcher asks more than once)."""
    key = ("kernels.why_not", backend)
    if key not in p.memo:
        p.memo[key] = _why_not(p, f'"{backend}"')
    return p.memo[key]


def _why_not(p: Problem, name: str) -> str | None:
    """The reason, `name` the backend's quoted name."""
    from attnlab.ops import kernels
    from attnlab.ops.kernels import build

    one = "needs each query row's keys as one interval"
    if p.score_mod is not None:
        return f"score_mod: backend {name} (compiled C++) cannot call a Python function"
    if p.query.device.type != "cpu":
        return f"backend: {name} runs on the CPU; the inputs are on {p.query.device}"
    if p.query.dtype not in gate.DTYPES:
        names = ", ".join(_dtype(t) for t in gate.DTYPES)
        return f"dtype: backend {name} takes {names}; got {_dtype(p.query.dtype)}"
    if p.dropout_p:
        return f"dropout_p: backend {name} has no dropout; got {p.dropout_p}"
    if p.attn_mask is not None:
        return f"attn_mask: backend {name} {one}; pass a structured mask= instead"
    if not build.enabled():
        return f"backend: {name} is turned off (ATTNLAB_KERNEL=0)"
    if p.structured is not None and runner.intervals_of(p) is None:  # no mask: [0, S) each
        return f"mask: backend {name} {one}; {p.structured!r} does not give them"
    if not _available(p):
        return f"backend: {name} is not available: {kernels.status().reason}"
    return None


def _available(p: Problem) -> bool:
    """The compiled library loads (built on first use), asked once per Problem."""
    from attnlab.ops import kernels

    key = ("kernels.available", None)
    if key not in p.memo:
        p.memo[key] = kernels.available()
    return p.memo[key]


def _dtype(t: torch.dtype) -> str:
    return str(t).removeprefix("torch.")
