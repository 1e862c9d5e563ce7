"""The cheap path of `attnlab.attention`: a call shaped like one seen before skips what depends
only on its signature — validation, folding the masks, the choice of backend and its why-not, the
memory check — and goes straight to the backend chosen then, through `dispatch.run`'s NaN/Inf
handling (the rules stay exactly the same: only what the signature decides is kept).

A signature is every input's type, shape, strides, dtype, device and requires_grad, the grad
mode, the scalar arguments (is_causal, scale, enable_gqa, dropout_p, softcap, return_lse) and
the structured mask *object*: the plan holds the mask itself and is used only for that very
object. A mask is a value (its constructors copy the tensors they are given, and nothing changes
one after it is built), so a mask whose meaning differs is another object and another plan.
Calls with a dense `attn_mask`, ALiBi slopes, a score_mod, sinks or a forced backend take the
full path every time (their tensors' contents would be part of the signature).

The first call of a signature takes the full path, which raises exactly what it always raised;
only a call that validated is kept. At most MAX_PLANS signatures are kept, the oldest dropped.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import OrderedDict

import torch
import torch.nn.functional as F

from attnlab.ops.kernels import build
from attnlab.ops.problem import Problem

#: signatures kept (a model has a few per layer shape; a generation loop one per cache length)
MAX_PLANS = 256


@dataclasses.dataclass
class Plan:
    template: Problem  # the validated Problem without its tensors (query, key, value: None)
    backend: str
    mask: object  # held so that its identity, part of the signature, stays its own
    #: SDPA called as it is (no mask or top-left causal, no lse, no modifier, 4-D, no gradient
    #: through the flash Function): (is_causal, scale, enable_gqa), else None
    sdpa: tuple | None = None


_PLANS: OrderedDict = OrderedDict()
# the kernel's switches are part of the signature (a plan names its backend), read from the
# process environment's own dict where there is one (os.environ.get encodes the name each time)
_ENV = getattr(os.environ, "_data", None) if os.name == "posix" else None
_KERNEL, _ISA = (b"ATTNLAB_KERNEL", b"ATTNLAB_KERNEL_ISA") if _ENV is not None else \
    ("ATTNLAB_KERNEL", "ATTNLAB_KERNEL_ISA")
_ENV = os.environ if _ENV is None else _ENV


def _tensor_sig(x):
    return (type(x), x.shape, x.stride(), x.dtype, x.device, x.requires_grad)


def signature(query, key, value, dropout_p, is_causal, scale, enable_gqa, mask, softcap,
              return_lse):
    """The call's signature, or None when it has no cheap one (an input that is not a tensor:
    the full path says what is wrong)."""
    try:
        sig = (_tensor_sig(query), _tensor_sig(key), _tensor_sig(value), dropout_p, is_causal,
               scale, enable_gqa, id(mask), softcap, return_lse, torch.is_grad_enabled(),
               _ENV.get(_KERNEL), _ENV.get(_ISA))
        hash(sig)
    except (AttributeError, TypeError):
        return None
    return sig


def lookup(sig) -> Plan | None:
    return None if sig is None else _PLANS.get(sig)


def _sdpa_as_is(p: Problem, backend: str, need_lse: bool) -> tuple | None:
    """The arguments of F.scaled_dot_product_attention when backend "sdpa" would call it with
    nothing around it but the NaN/Inf checks (`sdpa.forward`), else None."""
    from attnlab.ops import sdpa

    if backend != "sdpa" or need_lse or p.has_modifiers or p.dropout_p or p.dims.ndim != 4 or \
            p.attn_mask is not None or p.sinks is not None or p.query.device.type != "cpu" or \
            p.dims.L == 0 or p.dims.S == 0 or p.query.numel() == 0:
        return None
    if p.structured is not None and not p.is_plain_causal:
        return None
    if sdpa._flash_for_grad(p) or not p.scale > 0:
        return None
    return (p.structured is not None, p.scale, p.dims.groups > 1)


def run_sdpa(plan: Plan, query, key, value):
    """out of a plan that calls SDPA as it is, or None when an input holds NaN/Inf (the call
    then takes `dispatch.run`, which cleans and poisons by the rules). Without a mask every row
    sees every key, so only the queries are checked (as `dispatch.run` does); with the causal
    mask the keys and values too."""
    causal, scale, gqa = plan.sdpa
    if not _finite(query) or (causal and not (_finite(key) and _finite(value))):
        return None
    return F.scaled_dot_product_attention(query, key, value, None, 0.0, causal, scale=scale,
                                          enable_gqa=gqa)


def _finite(x: torch.Tensor) -> bool:
    """No NaN/Inf in x, or (rarely) a finite x whose sum overflows: the full path then decides.
    The kernel's op for float32 where it is loaded (1 µs), else the sum as a Python float."""
    if x.dtype == torch.float32 and x.is_contiguous():
        ops = build.loaded()
        if ops is not None:
            return bool(ops.all_finite(x))
    return math.isfinite(x.sum().item())


def keep(sig, p: Problem, backend: str, mask, need_lse: bool) -> None:
    """Keep the plan of a call that validated (its tensors dropped: no input is held alive)."""
    if sig is None:
        return
    template = dataclasses.replace(p, query=None, key=None, value=None, finite=False)
    _PLANS[sig] = Plan(template, backend, mask, _sdpa_as_is(p, backend, need_lse))
    while len(_PLANS) > MAX_PLANS:
        _PLANS.popitem(last=False)


def problem(plan: Plan, query, key, value) -> Problem:
    """The plan's Problem for these inputs (batch dims broadcast as make_problem does)."""
    d = plan.template.dims
    if d.ndim > 2:
        query, key, value = (x if x.shape[:-3] == d.batch else x.expand(*d.batch, *x.shape[-3:])
                             for x in (query, key, value))
    return dataclasses.replace(plan.template, query=query, key=key, value=value)


def clear() -> None:
    """Forget every plan (tests; a process that changes ATTNLAB_KERNEL or the ISA mid-run)."""
    _PLANS.clear()
