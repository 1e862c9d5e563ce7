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

Where the compiled kernel is loaded, the tensors' part of the signature comes from its `probe`
op, which in the same call checks the inputs for NaN/Inf (the query, and with any mask the keys
and values too: what `run_sdpa`'s rule checks) while each is float32, bfloat16 or float16 and
holds at most PRE_MAX values; its
verdict ('F' finite, 'N' not, 'U' not decided) is part of the signature. A plan kept under 'F'
that runs SDPA's kernel as it is runs it with no other check; one under 'N' takes
`dispatch.run`, which cleans and poisons by the rules; one under 'U' runs `run_sdpa`, which
checks each input itself. Elsewhere (the kernel off or not built, a tensor subclass) the
signature is a Python tuple and plans run `run_sdpa`.

Where the kernel is loaded, a plan under the probe's verdict that runs SDPA as it is is also kept
in the kernel's C table (csrc/serve.cpp), and `attention` asks it first (`serve`; only the decode
steps' own C table, `decode_steps.serve`, before it): one C call
that probes, finds the plan (the probe's string and the scalars it serves: is_causal,
enable_gqa, scale, dropout_p 0, no softcap, no lse, the mask object and the kernel's switches),
checks the inputs (under 'U', contiguous float32/bfloat16/float16 ones only, after the kernel,
as `run_sdpa`; a square causal call's values through its output's last row, which sees every
value: a NaN/Inf one makes it non-finite) and runs SDPA's ATen op, giving a gradient's SDPA node
the second-order pre-hook in C (it enters Python only for a backward that builds a graph). Any
other call, and one whose inputs are not finite, gets the probe's string back, which `find`
takes as it is.

The first call of a signature takes the full path, which raises exactly what it always raised;
only a call that validated is kept. At most MAX_PLANS signatures are kept, the oldest dropped.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import OrderedDict

import torch
import torch.nn.functional as F

from attnlab.ops.kernels import build, isa
from attnlab.ops.problem import Problem

#: signatures kept (a model has a few per layer shape; a generation loop one per cache length)
MAX_PLANS = 256
#: floats of one input the probe checks with the signature (L <= 64 at H = 8, D = 64: 128 KB,
#: ~3 µs for q, k and v in cache). Checking after SDPA's kernel instead (it has read them then)
#: cost one more probe call and measured slower: L = 64 +11.7 against +5.8 µs, L = 16 +5.7
#: against +3.6 (benchmarks/small_calls.py, 1 thread, medians of 3 runs). Larger inputs: the
#: kernel's `all_finite` on its work queue, after the call
PRE_MAX = 1 << 15


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
    #: call(query, key, value) -> out, or None where an input holds NaN/Inf: the `sdpa` way with
    #: the checks its signature's verdict leaves (`_caller`); None without `sdpa`
    call: object = None


_PLANS: OrderedDict = OrderedDict()
# the kernel's switches are part of the signature (a plan names its backend), read as stored
_ENV, _KERNEL, _ISA = isa.ENV, isa.KERNEL_KEY, isa.ISA_KEY


_TENSOR = torch.Tensor
#: the kernel's probe op per value of ATTNLAB_KERNEL, or None where it is off or not built
#: (`_probe_for`, once per value: a call never looks the build up)
_PROBES: dict = {}


def _serve_none(query, key, value, dropout_p, is_causal, scale, enable_gqa, mask, softcap,
                return_lse):
    return None


#: serve(query, key, value, dropout_p, is_causal, scale, enable_gqa, mask, softcap, return_lse)
#: -> the output of a call served whole in C (a plan that runs SDPA's kernel as it is, kept under
#: the probe's verdict: csrc/serve.cpp), else the probe's string for `find` (no such plan, or an
#: input not finite), else None (not probed). The kernel's entry once a plan was kept with the
#: kernel loaded (`_entry`); before, nothing is served
serve = _serve_none
_C: list = []  # the loaded build's (serve, keep, clear), once installed


def find(query, key, value, dropout_p, is_causal, scale, enable_gqa, mask, softcap,
         return_lse, layout=None):
    """(signature, the plan kept under it or None). The signature is None when the call has no
    cheap one (an input that is not a tensor: the full path says what is wrong); an unhashable
    one (a list as scale) finds no plan and keeps none. `layout`: the probe's string for these
    inputs where `serve` made it (the probe is not called again), else None."""
    kernel, sig = _ENV.get(_KERNEL), None
    probe = _PROBES.get(kernel, _probe_for)
    if probe is _probe_for:
        probe = _probe_for(kernel)
    if probe is not None and type(query) is type(key) is type(value) is _TENSOR:
        # layouts, grad mode and the NaN/Inf verdict; the keys and values checked with any mask
        if layout is None:
            try:
                layout = probe(query, key, value, -PRE_MAX if is_causal is False and mask is
                               None else PRE_MAX)
            except RuntimeError:  # under vmap (no batching rule): Python's signature, as
                layout = None  # without the probe
        if layout == "":  # a tensor without a plain layout (sparse, nested, a functorch wrapper)
            return None, None
        if layout is not None:
            sig = (layout, dropout_p, is_causal, scale, enable_gqa, id(mask), softcap,
                   return_lse, kernel, _ENV.get(_ISA))
    if sig is None:
        sig = signature(query, key, value, dropout_p, is_causal, scale, enable_gqa, mask,
                        softcap, return_lse)
        if sig is None:
            return None, None
    try:
        return sig, _PLANS.get(sig)
    except TypeError:  # unhashable
        return sig, None


def _probe_for(kernel):
    """The kernel's `probe` for this ATTNLAB_KERNEL value, or None (the kernel off, or not
    loadable without compiling)."""
    ops = _ops(True)
    probe = _raw(ops.probe) if ops is not None else None
    _PROBES[kernel] = probe
    return probe


def _raw(op):
    """A torch op's C++ entry, without torch.ops' Python layers around it (~0.3 µs a call)."""
    return getattr(op.default, "_op", op.default)


def signature(query, key, value, dropout_p, is_causal, scale, enable_gqa, mask, softcap,
              return_lse):
    """The call's signature in Python (one flat tuple: type, shape, strides, dtype, device and
    requires_grad of query, key and value, then the scalars), or None when it has no cheap one
    (an input that is not a tensor)."""
    try:
        return (type(query), query.shape, query.stride(), query.dtype, query.device,
                query.requires_grad, type(key), key.shape, key.stride(), key.dtype, key.device,
                key.requires_grad, type(value), value.shape, value.stride(), value.dtype,
                value.device, value.requires_grad, dropout_p, is_causal, scale, enable_gqa,
                id(mask), softcap, return_lse, torch.is_grad_enabled(), *isa.switches())
    except (AttributeError, TypeError):
        return None


def _sdpa_as_is(p: Problem, backend: str, need_lse: bool) -> tuple | None:
    """How backend "sdpa" runs this call when it calls PyTorch's kernel with nothing around it
    but the NaN/Inf checks (`sdpa.forward`): (run, is_causal, scale, enable_gqa), else None."""
    from attnlab.ops import fused_cpu, sdpa

    if backend != "sdpa" or need_lse or p.has_modifiers or p.dropout_p or \
            p.dims.ndim not in (2, 3, 4) or p.attn_mask is not None or p.sinks is not None or \
            p.query.device.type != "cpu" or p.dims.L == 0 or p.dims.S == 0 or \
            p.query.numel() == 0 or not p.scale > 0:  # (L, D), (H, L, D) too: SDPA takes them
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
    causal mask the keys and values too, one by one (`plan.finite`), after the kernel has read
    them (its result dropped where one is not finite)."""
    run, causal, scale, gqa = plan.sdpa
    out = run(query, key, value, causal, scale) if gqa is None else \
        run(query, key, value, causal, scale, gqa)
    finite = plan.finite
    if not finite(query) or (causal and not (finite(key) and finite(value))):
        return None
    return out


def _caller(plan: Plan, verdict: str):
    """plan.call: SDPA's kernel with no check where the probe found the inputs finite (no
    Python frame of ours around it: a partial of SDPA itself, or of `sdpa.flash`), else
    `run_sdpa` (the probe left the check to it). A plan under 'N' keeps no `sdpa`."""
    if verdict != "F":
        return functools.partial(run_sdpa, plan)
    hooked, causal, scale, gqa = _as_called(plan)
    if not hooked:
        kw = {"is_causal": causal, "enable_gqa": True} if gqa else {"is_causal": causal}
        if scale is not None:
            kw["scale"] = scale
        return functools.partial(F.scaled_dot_product_attention, **kw)
    return functools.partial(plan.sdpa[0], is_causal=causal, scale=scale)  # sdpa.flash


def _as_called(plan: Plan) -> tuple:
    """How a plan under 'F' calls SDPA: (hooked: `sdpa.flash`, whose SDPA node gets the
    second-order pre-hook, is_causal, scale or None where it is SDPA's own default bit for bit
    (passing it costs SDPA's argument parser 0.2 µs), enable_gqa)."""
    run, causal, scale, gqa = plan.sdpa
    if run is not _sdpa_plain:  # sdpa.flash: the scale passed, grouped heads by their shapes
        return True, causal, scale, plan.template.dims.groups > 1
    D = plan.template.dims.D
    if D > 0 and scale == 1.0 / math.sqrt(D):
        scale = None
    return False, causal, scale, bool(gqa)


def _finite_with(ops):
    """The NaN/Inf check of one tensor for a plan: no NaN/Inf in x, or (rarely) a finite x whose
    sum overflows, for which the full path then decides. The kernel's op (1 µs) for float32
    where the kernel was loaded when the plan was made (a plan is made per kernel switch: part
    of the signature), else the sum as a Python float; a call never looks the build up."""
    if ops is None:
        return _sum_finite
    op = _raw(ops.all_finite)

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
    verdict = sig[0][-1] if type(sig[0]) is str else "U"  # the probe's, else none
    how = None if verdict == "N" else _sdpa_as_is(p, backend, need_lse)
    plan = Plan(template, backend, mask, how, _finite_with(_ops(how is not None)))
    if how is not None:
        plan.call = _caller(plan, verdict)
        if type(sig[0]) is str and _entry() is not None:  # served whole in C from the next call
            _C[0][1](*sig[:5], mask, *sig[6:], *_as_called(plan))
    _PLANS[sig] = plan
    if _PROBES.get(sig[-2], 0) is None and build.loaded() is not None:
        del _PROBES[sig[-2]]  # the kernel was loaded since: the next call takes its probe
    while len(_PLANS) > MAX_PLANS:
        _PLANS.popitem(last=False)


def _entry():
    """The loaded build's (serve, keep, clear) (csrc/serve.cpp), installed once (`serve` is
    then the C one), or None where no build is loaded."""
    if not _C:
        from attnlab.ops import sdpa

        fns = build.c_functions("attnlab_cheap_entry", sdpa._twice, _ENV, _KERNEL, _ISA, PRE_MAX,
                                MAX_PLANS)
        if fns is None:
            return None
        _C.append(fns)
        global serve
        serve = _C[0][0]
    return _C[0]


_LOAD_TRIED = [False]


def _ops(checks: bool):
    """The kernel's ops for a plan's NaN/Inf check or the probe: the loaded build, or, once per
    process where the kernel is on (a plain SDPA call never loads it), the chosen build when it
    is there to load without compiling (in the wheel or the cache); else None (the checks then
    sum, the signature is Python's)."""
    ops = build.loaded()
    if ops is None and checks and not _LOAD_TRIED[0] and build.enabled():
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
    """Forget every plan and probe (tests; a process that changes ATTNLAB_KERNEL or the ISA
    mid-run)."""
    _PLANS.clear()
    _PROBES.clear()
    if _C:
        _C[0][2]()
