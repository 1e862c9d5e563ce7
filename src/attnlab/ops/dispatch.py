"""Backend registry and the "auto" choice.

`select_backend` tells which backend a call would use and why, so the choice can be inspected;
`backend=` on the public op forces one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnlab.ops import math as math_backend
from attnlab.ops import numpy_ref, sdpa
from attnlab.ops.problem import Problem


@dataclass(frozen=True)
class Choice:
    backend: str
    reason: str


def _sdpa_lse_ok(p: Problem) -> bool:
    return (
        sdpa.has_lse_kernel(p.query.device)
        and p.dims.D == p.dims.Dv
        and p.dims.L > 0
        and p.dims.S > 0
        and p.query.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    )


def choose(p: Problem, need_lse: bool) -> Choice:
    """The backend "auto" runs for this problem."""
    if p.dims.S == 0 or p.dims.L == 0:
        return Choice("math", "empty sequence")
    if need_lse and not _sdpa_lse_ok(p):
        return Choice("math", "log-sum-exp requested and the fused kernel can't return it here")
    if p.structured is None and p.attn_mask is None:
        return Choice("sdpa", "no mask: PyTorch's fused kernel")
    if p.is_plain_causal:
        return Choice("sdpa", "top-left causal: PyTorch's fused kernel with is_causal=True")
    return Choice("sdpa", "mask given as a dense matrix to PyTorch's fused kernel")


def _run_sdpa(p: Problem, need_lse: bool):
    if need_lse and not _sdpa_lse_ok(p):
        return math_backend.forward(p)  # the same numbers, with the lse the kernel can't give here
    return sdpa.forward(p, need_lse=need_lse)


#: backend name -> runner(problem, need_lse) -> (out, lse or None)
RUNNERS: dict[str, Callable[[Problem, bool], tuple]] = {
    "sdpa": _run_sdpa,
    "math": lambda p, need_lse: math_backend.forward(p),
    "reference": lambda p, need_lse: numpy_ref.forward(p),
}
BACKENDS = ("auto", *RUNNERS)


def run(name: str, p: Problem, need_lse: bool):
    """(out, lse or None) from backend `name`, "auto" resolved here."""
    if name == "auto":
        name = choose(p, need_lse).backend
    return RUNNERS[name](p, need_lse)
