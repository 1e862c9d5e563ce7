"""The "auto" choice, and running a backend.

`choose` is the one ordered table "auto" follows; `select_backend` tells which backend a call
would use and why, so the choice can be inspected; `backend=` on the public op forces one, and
`run` refuses a forced backend that cannot run the call with its reason (`backends.py`: each
backend's forward and why-not).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from attnlab.errors import AttnlabError
from attnlab.ops import (
    budget,
    flex,
    fused_cpu,
    nonfinite,
    nonfinite_device,
    plain,
    sinks,
    tiled,
)
from attnlab.ops.backends import REGISTRY, interval_why_not, mask_grad, sdpa_on_math
from attnlab.ops.kernels import decode
from attnlab.ops.problem import Problem
from attnlab.ops.scores import accum_dtype


@dataclass(frozen=True)
class Choice:
    backend: str
    reason: str


#: up to this many query rows a top-left causal call costs less on SDPA's fused kernel than on
#: the interval kernel (`benchmarks/small_calls.py`: its fixed cost is lower; with a gradient
#: through `sdpa._Flash`, when its heads and batch match)
SMALL_CAUSAL = 64
#: below this many score entries (L·S) a dense mask costs less than the tiled loop's overhead
SMALL_SCORES = 1024 * 1024
#: above this fraction of visited tiles the fused kernel with a dense mask wins (if it fits)
DENSE_ENOUGH = 0.75
#: above this many score entries a dense (L, S) mask is not built at all: memory stays linear
HUGE_SCORES = 8192 * 8192


def choose(p: Problem, need_lse: bool) -> Choice:
    """The backend "auto" runs for this problem.

    The rule comes from `benchmarks/attention.py` and `benchmarks/kernel.py` on a CPU: the
    interval kernel wins wherever it runs and there is something to skip or fuse (a structured
    mask, softcap/ALiBi, the lse); otherwise PyTorch's fused kernel is fastest where its
    semantics match (no mask, top-left causal); the tiled loop wins as soon as a structured mask
    leaves tiles empty, and is the only other path whose memory stays linear in L.
    """
    need_lse = need_lse or p.sinks is not None  # sinks join through the lse (`ops.sinks`)
    d = p.dims
    if _empty(p):
        return Choice("math", "empty input: nothing to compute")
    if on_device(p):
        return _choose_device(p, need_lse)
    if mask_grad(p):
        return Choice("math", "a float attn_mask that needs a gradient: autograd through math")
    if decode.takes(p, need_lse):
        return Choice("decode", decode.reason(p, need_lse, _isa()))
    if p.is_plain_causal and d.L <= SMALL_CAUSAL and not need_lse and not p.has_modifiers \
            and fused_cpu.applies(p) and (not _records_grad(p) or _lean_grad(p)):
        return Choice("sdpa", f"small top-left causal (L = {d.L} <= {SMALL_CAUSAL}): "
                              "PyTorch's fused kernel with is_causal=True has the lowest fixed "
                              "cost")
    if (p.structured is not None or p.has_modifiers or need_lse) and _interval(p):
        return Choice("interval", f"{_interval_why(p, need_lse)}: the compiled interval kernel "
                                  f"({_isa()}) computes only each row's key interval")
    if p.score_mod is not None:
        return Choice("tiled", "score_mod: the tiled loop's plain path calls it on each chunk "
                               "(forward and backward); the fused and interval kernels cannot")
    if p.has_modifiers:
        return Choice("tiled", "softcap/ALiBi: the fused kernel cannot apply them")
    if need_lse and not fused_cpu.applies(p):
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
    dens = tiled.plan_for(p, fused=fused_cpu.applies(p)).density  # the plan tiled will run
    if dens > DENSE_ENOUGH:
        return Choice("sdpa", f"mask keeps {dens:.0%} of the tiles: dense mask, fused kernel")
    return Choice("tiled", f"structured mask: the tiled kernel visits {dens:.0%} of the tiles")


def _records_grad(p: Problem) -> bool:
    """Autograd records this call: then the interval kernel's Function costs less than the
    "sdpa" backend's `sdpa._FlashLse` (a broadcast batch), though not than SDPA's own node
    (`sdpa.flash`, grouped heads included: `_lean_grad`)."""
    return torch.is_grad_enabled() and any(x.requires_grad for x in (p.query, p.key, p.value))


def _lean_grad(p: Problem) -> bool:
    """Backend "sdpa" runs this causal call with a gradient on SDPA's own node (`sdpa.flash`)."""
    from attnlab.ops import sdpa

    return sdpa.lean_applies(p.query, p.key, p.value, True, p.scale)


def on_device(p: Problem) -> bool:
    """The call runs on an accelerator (CUDA): SDPA's and Flex's device kernels, no host syncs."""
    return p.query.device.type == "cuda"


def _choose_device(p: Problem, need_lse: bool) -> Choice:
    """The "auto" choice on CUDA: SDPA (flash / cuDNN / efficient) where it expresses the call
    exactly (no mask, top-left causal, a dense attn_mask), compiled FlexAttention for structured
    masks, mask functions, score_mods and the lse, which SDPA's CUDA kernels don't return."""
    if mask_grad(p):
        return Choice("math", "a float attn_mask that needs a gradient: autograd through math")
    flexible = p.has_modifiers or (p.structured is not None and not p.is_plain_causal)
    if p.dropout_p > 0:
        if flexible:
            return Choice("math", "dropout with a structured mask or score modifier: FlexAttention "
                                  "has no dropout, so autograd through math")
        return Choice("sdpa", "dropout: PyTorch's fused kernel")
    if not flex.available():
        return Choice("math" if flexible or need_lse else "sdpa",
                      "this torch has no FlexAttention")
    if p.query.dtype not in (torch.float16, torch.bfloat16, torch.float32) and (
            flexible or need_lse):
        return Choice("math", f"{p.query.dtype}: FlexAttention's CUDA kernels take fp16, bf16 "
                              "and fp32, so autograd through math")
    if p.score_mod is not None:
        return Choice("flex", "score_mod: compiled FlexAttention calls it inside the kernel")
    if p.has_modifiers:
        return Choice("flex", "softcap/ALiBi: compiled FlexAttention as a score_mod")
    if p.structured is not None and not p.is_plain_causal:
        return Choice("flex", "structured mask: compiled FlexAttention skips the empty tiles "
                              "(a BlockMask from the mask's tile classes)")
    if need_lse:
        return Choice("flex", "log-sum-exp requested: SDPA's CUDA kernels don't return it")
    if p.attn_mask is not None:
        return Choice("sdpa", "a dense attn_mask: PyTorch's fused kernel with it")
    if p.is_plain_causal:
        return Choice("sdpa", "top-left causal: PyTorch's fused kernel with is_causal=True")
    return Choice("sdpa", "no mask: PyTorch's fused kernel (flash / cuDNN / efficient)")


def _interval_why(p: Problem, need_lse: bool) -> str:
    if p.structured is not None:
        return "interval-shaped mask"
    return "softcap/ALiBi" if p.has_modifiers else "log-sum-exp requested"


def _isa() -> str:
    """The ISA of the build that runs (for the reason; read on every call, so no file is read)."""
    from attnlab.ops.kernels import build

    try:
        return build.chosen_isa()
    except AttnlabError:
        return "?"


def _interval(p: Problem) -> bool:
    """The interval kernel runs this call (`backends.interval_why_not` says why not)."""
    return interval_why_not(p, False) is None


BACKENDS = ("auto", *REGISTRY)


def run(name: str, p: Problem, need_lse: bool, *, clean_always: bool = False):
    """(out, lse or None) from backend `name`, "auto" resolved here.

    Every backend gets the same treatment of empty inputs, of the memory limit of dense paths
    (`budget`) and of NaN/Inf in queries, keys and values (`nonfinite`; `clean_always`: keys and
    values too when the call has no mask, for a block of a masked context-parallel call).
    """
    if p.sinks is not None:  # every backend's (out, lse), then the sinks joined exactly
        out, lse = run(name, dataclasses.replace(p, sinks=None), True, clean_always=clean_always)
        return sinks.attach(p, out, lse)
    if name == "auto":
        name = choose(p, need_lse).backend
    if _empty(p):
        return plain.forward(p)  # empty in, empty out: the same on every backend
    backend = REGISTRY[name]
    why = backend.why_not(p, need_lse)
    if why is not None:
        raise AttnlabError(why)
    _check_budget(name, p, need_lse)
    if on_device(p):  # no host syncs on a device; a NaN query row is NaN through the kernel
        p, bad = nonfinite_device.clean(p)
        out, lse = backend.forward(p, need_lse)
        if bad is not None:
            out, lse = nonfinite_device.poison(p, bad, out, lse)
        return out, lse
    if backend.checked is not None:  # it checks what it reads as it runs: no separate pass
        got = backend.checked(p, need_lse)
        if got is not None:
            return got  # else NaN/Inf found: cleaned and computed again
    # a compiled kernel's running max passes over a NaN score, so it cannot be left to spread
    # NaN itself even without a mask: its poisoned positions are always cleaned and poisoned
    p, bad = nonfinite.clean(p, always=clean_always or backend.checked is not None)
    p, bad_q = nonfinite.clean_queries(p)
    out, lse = backend.forward(p, need_lse)
    if bad is not None:
        out, lse = nonfinite.poison(p, bad, out, lse)
    if bad_q is not None:
        out, lse = nonfinite.poison_queries(p, bad_q, out, lse)
    return out, lse


def _empty(p: Problem) -> bool:
    """No query row, no key, or no head/batch element: nothing to compute."""
    return min(p.query.numel(), p.key.numel(), p.value.numel()) == 0


def _check_budget(name: str, p: Problem, need_lse: bool) -> None:
    """Refuse a dense path whose (..., H, L, S) buffers exceed `budget.limit()`."""
    if name not in ("reference", "math", "sdpa"):  # the others hold no (L, S) buffer
        return
    scores = p.dims.scores_shape
    n = budget.entries(scores)
    acc = accum_dtype(p.query.dtype).itemsize
    fits = 'backend="tiled" computes it with memory linear in L'
    if name == "reference":
        budget.check("backend", '"reference" (NumPy float64)', scores, n * (6 * 8 + 1),
                     fits)
    elif name == "math" or (name == "sdpa" and sdpa_on_math(p, need_lse)):
        what = f'"{name}"' + (" (on the math path here)" if name == "sdpa" else "")
        grad = torch.is_grad_enabled() and any(
            x is not None and x.requires_grad for x in (p.query, p.key, p.value, p.attn_mask))
        per = 6 * acc + 2 if grad else 4 * acc + 1  # autograd keeps more of them alive
        budget.check("backend", what, scores, n * per, fits)
    elif name == "sdpa" and not p.is_plain_causal and (
            p.structured is not None or p.attn_mask is not None):
        m = _dense_mask_entries(p)
        size = p.query.element_size()
        budget.check("backend", '"sdpa" with a dense mask', scores,
                     m * (1 + size), fits)


def _dense_mask_entries(p: Problem) -> int:
    """Entries of the one dense mask the sdpa backend builds from all masks of a call."""
    d = p.dims
    shape = [1, 1, d.L, d.S]
    if p.structured is not None:
        shape[:2] = [p.structured.batch_size, p.structured.heads]
    n = budget.entries(shape)
    if p.attn_mask is not None:
        n = max(n, budget.entries(p.attn_mask.shape[:-2]) * d.L * d.S)
    return n
