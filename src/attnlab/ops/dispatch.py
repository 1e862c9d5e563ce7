"""Backend registry and the "auto" choice.

`select_backend` tells which backend a call would use and why, so the choice can be inspected;
`backend=` on the public op forces one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnlab.ops import math as math_backend
from attnlab.ops import numpy_ref, sdpa, tiled, tiled_plan
from attnlab.ops.problem import Problem


@dataclass(frozen=True)
class Choice:
    backend: str
    reason: str


def _sdpa_lse_ok(p: Problem) -> bool:
    return (
        sdpa.has_lse_kernel(p.query.device)
        and p.dims.Dv == p.dims.D
        and p.dims.L > 0
        and p.dims.S > 0
        and p.dropout_p == 0  # the CPU flash kernel that returns the lse refuses dropout
        and p.query.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    )


#: below this many score entries (L·S) a dense mask costs less than the tiled loop's overhead
SMALL_SCORES = 1024 * 1024
#: above this fraction of visited tiles the fused kernel with a dense mask wins (if it fits)
DENSE_ENOUGH = 0.75
#: above this many score entries a dense (L, S) mask is not built at all: memory stays linear
HUGE_SCORES = 8192 * 8192


def choose(p: Problem, need_lse: bool) -> Choice:
    """The backend "auto" runs for this problem.

    The rule comes from `benchmarks/attention.py` on a CPU: PyTorch's fused kernel is fastest
    where its semantics match (no mask, top-left causal); the tiled kernel wins as soon as a
    structured mask leaves tiles empty, and is the only path whose memory stays linear in L.
    """
    d = p.dims
    if d.S == 0 or d.L == 0:
        return Choice("math", "empty sequence")
    if p.attn_mask is not None and p.attn_mask.requires_grad and torch.is_grad_enabled():
        return Choice("math", "a float attn_mask that needs a gradient: autograd through math")
    if p.has_modifiers:
        return Choice("tiled", "softcap/ALiBi: the fused kernel cannot apply them")
    if need_lse and not _sdpa_lse_ok(p):
        return Choice("tiled", "log-sum-exp requested and the fused kernel can't return it here")
    if p.structured is None and p.attn_mask is None:
        return Choice("sdpa", "no mask: PyTorch's fused kernel")
    if p.is_plain_causal:
        return Choice("sdpa", "top-left causal: PyTorch's fused kernel with is_causal=True")
    n = d.L * d.S
    if n <= SMALL_SCORES:
        return Choice("sdpa", f"small ({d.L}×{d.S}): dense mask to the fused kernel")
    if n > HUGE_SCORES:
        return Choice("tiled", f"long ({d.L}×{d.S}): no dense mask; memory linear in L")
    if p.structured is None:  # the dense mask exists already: tiling would save no memory
        return Choice("sdpa", "a dense attn_mask only: the fused kernel with it")
    dens = tiled_plan.density(p)
    if dens > DENSE_ENOUGH:
        return Choice("sdpa", f"mask keeps {dens:.0%} of the tiles: dense mask, fused kernel")
    return Choice("tiled", f"structured mask: the tiled kernel visits {dens:.0%} of the tiles")


def _run_sdpa(p: Problem, need_lse: bool):
    if p.has_modifiers:
        return math_backend.forward(p)  # the fused kernel has no softcap/ALiBi
    if need_lse and not _sdpa_lse_ok(p):
        return math_backend.forward(p)  # the same numbers, with the lse the kernel can't give here
    return sdpa.forward(p, need_lse=need_lse)


#: backend name -> runner(problem, need_lse) -> (out, lse or None)
RUNNERS: dict[str, Callable[[Problem, bool], tuple]] = {
    "sdpa": _run_sdpa,
    "math": lambda p, need_lse: math_backend.forward(p),
    "tiled": tiled.forward,
    "reference": lambda p, need_lse: numpy_ref.forward(p),
}
BACKENDS = ("auto", *RUNNERS)


def run(name: str, p: Problem, need_lse: bool):
    """(out, lse or None) from backend `name`, "auto" resolved here."""
    if name == "auto":
        name = choose(p, need_lse).backend
    return RUNNERS[name](p, need_lse)
