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
    #: a call SDPA states exactly (no mask or top-left causal, no lse, no modifier, 4-D) run on
    #: PyTorch's kernel with nothing around it but the NaN/Inf checks: (run, causal, scale,
    #: gqa), run F.scaled_dot_product_attention (no gradient) or `sdpa._Flash` (a gradient);
    #: else None
    sdpa: tuple | None = None
    #: the NaN/Inf check of one tensor (`_finite_with`)
    finite: object = None


_PLANS: OrderedDict = OrderedDict()
# the kernel's switches are part of the signature (a plan names its backend), read from the
# process environment's own dict where there is one (os.environ.get encodes the name each time)
_ENV = getattr(os.environ, "_data", None) if os.name == "posix" else None
_KERNEL, _ISA = (b"ATTNLAB_KERNEL", b"ATTNLAB_KERNEL_ISA") if _ENV is not None else \
    ("ATTNLAB_KERNEL", "ATTNLAB_KERNEL_ISA")
_ENV = os.environ if _ENV is None else _ENV


def signature(query, key, value, dropout_p, is_causal, scale, enable_gqa, mask, softcap,
              return_lse):
    """The call's signature (one flat tuple: type, shape, strides, dtype, device and
    requires_grad of query, key and value, then the scalars), or None when it has no cheap one
    (an input that is not a tensor: the full path says what is wrong). An unhashable one (a
    list as scale) finds no plan and keeps none."""
    try:
        return (type(query), query.shape, query.stride(), query.dtype, query.device,
                query.requires_grad, type(key), key.shape, key.stride(), key.dtype, key.device,
                key.requires_grad, type(value), value.shape, value.stride(), value.dtype,
                value.device, value.requires_grad, dropout_p, is_causal, scale, enable_gqa,
                id(mask), softcap, return_lse, torch.is_grad_enabled(), _ENV.get(_KERNEL),
                _ENV.get(_ISA))
    except (AttributeError, TypeError):
        return None


def lookup(sig) -> Plan | None:
    if sig is None:
        return None
    try:
        return _PLANS.get(sig)
    except TypeError:  # unhashable
        return None


def _sdpa_as_is(p: Problem, backend: str, need_lse: bool) -> tuple | None:
    """How backend "sdpa" runs this call when it calls PyTorch's kernel with nothing around it
    but the NaN/Inf checks (`sdpa.forward`): (run, is_causal, scale, enable_gqa), else None."""
    from attnlab.ops import fused_cpu, sdpa

    if backend != "sdpa" or need_lse or p.has_modifiers or p.dropout_p or p.dims.ndim != 4 or \
            p.attn_mask is not None or p.sinks is not None or p.query.device.type != "cpu" or \
            p.dims.L == 0 or p.dims.S == 0 or p.query.numel() == 0 or not p.scale > 0:
        return None
    if p.structured is not None and not p.is_plain_causal:
        return None
    causal = p.structured is not None
    if not sdpa._flash_for_grad(p):
        return (_sdpa_plain, causal, p.scale, p.dims.groups > 1)
    q, k, v = p.query, p.key, p.value
    if sdpa.lean_applies(q, k, v, causal, p.scale) and all(
            fused_cpu.laid_out(x) is x for x in (q, k, v)):  # strides: part of the signature
        return (sdpa.flash, causal, p.scale, None)
    return None


def _sdpa_plain(query, key, value, causal, scale, gqa):
    return F.scaled_dot_product_attention(query, key, value, None, 0.0, causal, scale=scale,
                                          enable_gqa=gqa)


def run_sdpa(plan: Plan, query, key, value):
    """out of a plan that calls SDPA's kernel as it is, or None when an input holds NaN/Inf (the
    call then takes `dispatch.run`, which cleans and poisons by the rules). Without a mask every
    row sees every key, so only the queries are checked (as `dispatch.run` does); with the
    causal mask the keys and values too."""
    run, causal, scale, gqa = plan.sdpa
    finite = plan.finite
    if not finite(query) or (causal and not (finite(key) and finite(value))):
        return None
    if gqa is None:
        return run(query, key, value, causal, scale)
    return run(query, key, value, causal, scale, gqa)


def _finite_with(ops):
    """The NaN/Inf check of one tensor for a plan: no NaN/Inf in x, or (rarely) a finite x whose
    sum overflows, for which the full path then decides. The kernel's op (1 µs) for float32
    where the kernel was loaded when the plan was made (a plan is made per kernel switch: part
    of the signature), else the sum as a Python float; a call never looks the build up."""
    if ops is None:
        return _sum_finite
    op = ops.all_finite

    def finite(x: torch.Tensor) -> bool:
        if x.dtype == torch.float32 and x.is_contiguous():
            return op(x)
        return _sum_finite(x)

    return finite


def _sum_finite(x: torch.Tensor) -> bool:
    return math.isfinite((x.detach() if x.requires_grad else x).sum().item())  # no graph


def keep(sig, p: Problem, backend: str, mask, need_lse: bool) -> None:
    """Keep the plan of a call that validated (its tensors dropped: no input is held alive)."""
    if sig is None:
        return
    try:
        hash(sig)
    except TypeError:
        return
    template = dataclasses.replace(p, query=None, key=None, value=None, finite=False)
    how = _sdpa_as_is(p, backend, need_lse)
    _PLANS[sig] = Plan(template, backend, mask, how, _finite_with(_ops(how is not None)))
    while len(_PLANS) > MAX_PLANS:
        _PLANS.popitem(last=False)


_LOAD_TRIED = [False]


def _ops(checks: bool):
    """The kernel's ops for a plan's NaN/Inf check: the loaded build, or, once per process for
    a plan whose every call checks its inputs (a plain SDPA call, which never loads the
    kernel), the chosen build when it is there to load without compiling (in the wheel or the
    cache); else None (the checks then sum)."""
    ops = build.loaded()
    if ops is None and checks and not _LOAD_TRIED[0]:
        _LOAD_TRIED[0] = True
        if build.status().built:
            ops = build.get()
    return ops


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
