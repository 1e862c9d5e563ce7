"""The backends: each one's forward and, next to it, why it cannot run a call.

Every backend has one call shape, `forward(problem, need_lse) -> (out, lse | None)`, and one
`why_not(problem, need_lse) -> str | None` (None: it runs this call; else the error message,
naming the argument first). `dispatch.choose` picks among them ("auto"); `dispatch.run` refuses
a forced backend whose `why_not` answers, with that message as one AttnlabError, and gives every
backend the same treatment of empty inputs, memory limits and NaN/Inf.

    "sdpa"       PyTorch's fused kernel (softcap/ALiBi, or an lse it can't return: the math path)
    "interval"   the compiled interval kernel (`ops/kernels`): CPU, one key interval per row
    "decode"     the compiled decode kernel (`ops/kernels/decode.py`): a few rows, a long cache
    "tiled"      the chunk loop (`ops/tiled`): online softmax, masked-out tiles skipped, any mask
    "math"       plain PyTorch with the full score matrix (autograd through everything)
    "reference"  the NumPy float64 oracle (no autograd)
    "flex"       PyTorch's FlexAttention (compiled on CUDA)

Adding one: a module with `forward(p, need_lse)` (and `why_not` when it cannot run every call),
an entry in REGISTRY, a row in `dispatch.choose` if "auto" should pick it, and its name in the
tests' backend list (`docs/develop.md`, "A backend").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnlab.ops import flex, fused_cpu, numpy_ref, plain, sdpa, tiled
from attnlab.ops.kernels import applies, decode, runner
from attnlab.ops.problem import Problem

Forward = Callable[[Problem, bool], tuple]  # (p, need_lse) -> (out, lse | None)
WhyNot = Callable[[Problem, bool], "str | None"]  # (p, need_lse) -> None: it runs the call


@dataclass(frozen=True)
class Backend:
    """One backend.

    checked: a forward that checks q, k and v for NaN/Inf as it reads them and returns None
    when one is not finite (the call is then cleaned, `ops.nonfinite`, and run by `forward`),
    so a finite call needs no separate pass over its inputs; None: `dispatch.run` cleans first.
    """

    name: str
    forward: Forward
    why_not: WhyNot
    summary: str
    checked: Callable | None = None


def runs_anything(p: Problem, need_lse: bool) -> str | None:
    """The why_not of a backend that runs every call."""
    return None


# --- "sdpa" ---------------------------------------------------------------------------------

def sdpa_forward(p: Problem, need_lse: bool):
    if sdpa_on_math(p, need_lse):
        return plain.forward(p)  # the same numbers, with what the kernel can't do here
    return sdpa.forward(p, need_lse=need_lse)


def sdpa_on_math(p: Problem, need_lse: bool) -> bool:
    """Backend "sdpa" computes this call on the math path: softcap/ALiBi/score_mod, or an lse
    the fused kernel can't return here (or not with a float attn_mask that needs a gradient)."""
    return p.has_modifiers or (need_lse and (not fused_cpu.applies(p) or mask_grad(p)))


def mask_grad(p: Problem) -> bool:
    """A float attn_mask that autograd tracks: only the math path gives its gradient."""
    return p.attn_mask is not None and p.attn_mask.requires_grad and torch.is_grad_enabled()


# --- "interval" -----------------------------------------------------------------------------

def interval_forward(p: Problem, need_lse: bool):
    return runner.forward(p, need_lse)


def interval_checked(p: Problem, need_lse: bool):
    """The kernel checking every key and each query and value row it reads: None when one holds
    NaN/Inf (7% of a window's forward at 16k saved against a separate pass)."""
    return runner.forward(p, need_lse, verify=True)


def interval_why_not(p: Problem, need_lse: bool) -> str | None:
    """Why the interval kernel cannot run this call (None: it can): `kernels/applies.py`."""
    return applies.why_not(p, "interval")


# --- the registry: name -> Backend, in the order the docs list them --------------------------

REGISTRY: dict[str, Backend] = {b.name: b for b in (
    Backend("sdpa", sdpa_forward, runs_anything,
            "PyTorch's fused kernel (its lse through one gate, `ops/fused_cpu.py`); softcap, "
            "ALiBi and score_mod on the math path"),
    Backend("interval", interval_forward, interval_why_not,
            "the compiled C++ interval kernel (CPU; float32/16, bfloat16): each query row's one "
            "key interval, forward and backward, GQA without copies, softcap and ALiBi",
            checked=interval_checked),
    Backend("decode", lambda p, need_lse: decode.forward(p, need_lse), decode.why_not,
            "the compiled C++ decode kernel (CPU; float32/16, bfloat16): at most 16 query rows "
            "against a key/value cache read once per step as stored, the query heads of a "
            "key/value head together, split over the keys across threads",
            checked=decode.checked),
    Backend("tiled", lambda p, need_lse: tiled.forward(p, need_lse), runs_anything,
            "the chunk loop: online softmax over key chunks, masked-out tiles skipped, any mask, "
            "memory linear in L"),
    Backend("math", lambda p, need_lse: plain.forward(p), runs_anything,
            "plain PyTorch with the full score matrix; autograd through every input"),
    Backend("reference", lambda p, need_lse: numpy_ref.forward(p), numpy_ref.why_not,
            "the NumPy float64 oracle (no autograd)"),
    Backend("flex", flex.forward, flex.why_not,
            "PyTorch's FlexAttention, compiled on CUDA (what \"auto\" uses there for structured "
            "masks, mask functions, score_mods and the lse)"),
)}
