"""The decode step path of `attnlab.attention`: a decoding loop's next step, whose key/value
cache grew by a row (or a few) since the last one, skips validating and choosing what its
cache length does not change.

`ops/cheap.py` keeps a plan per signature, and a signature holds every shape: a cache that grows
by one key each step is a new signature each step (the full path's validation and choice, ~60 µs
of Python a step, and one plan more per step, evicting the others). A step plan is kept instead
for a call "auto" gave the decode kernel, under the signature without the cache length S: the
type, shape, strides, dtype, device and requires_grad of the query; the same of key and value
but their S and strides (the kernel reads any strides, a slice of a preallocated cache as
well as a cache `torch.cat` grows); the scalar arguments, the grad mode and the mask *object*
(held by the plan, so its identity stays its own, as in `cheap.py`) and the kernel's switches
(ATTNLAB_KERNEL, ATTNLAB_KERNEL_ISA), under which the plan keeps the answers that depend on none
of S: that the kernel is available, and for a call without a mask that it can run the call.

A step with another S redoes exactly what depends on S, with the full path's own functions:
key and value of one length (else the full path says what is wrong), the structured mask checked
and simplified for (L, S) (`validate._structured`; an error: the full path raises it) and the
choice (`decode.takes`, which is "auto"'s answer for a call of this signature: at least
`decode.min_keys` keys); a step it does not give the decode
kernel takes the full path. The step then runs as `dispatch.run` runs the decode backend
(its `checked`: the kernel checks what it reads; NaN/Inf cleaned and poisoned by the rules).

A plan without a mask (or with `_every_key`'s one) whose signature was read in C (its step: the
kernel's op alone, `_lean`) is
also kept in the kernel's C table (csrc/decode_serve.cpp), which `attention` asks first (`serve`):
one C call that reads the S-free signature, finds the plan under it, the call's scalars, its mask
object and the kernel's switches exactly as `find` keys them, and runs the plan's build's C step,
returning its output where every row it read was finite; any other call, and one that reads a
row not finite, comes back None and takes the path above. It holds at most MAX_PLANS plans, the
least recently served dropped.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import torch

from attnlab.errors import AttnlabError
from attnlab.masks.positional import Causal
from attnlab.ops import cheap
from attnlab.ops.backends import REGISTRY
from attnlab.ops.kernels import build, decode, isa
from attnlab.ops.problem import Dims, Problem
from attnlab.ops.validate import _structured

#: step plans kept (one per decode signature: a model's layer shapes, a mask object per step
#: where a model builds its mask every forward), the least recently used dropped
MAX_PLANS = 64


@dataclasses.dataclass
class Step:
    template: Problem  # the validated Problem of one step, without its tensors
    #: the answers of `applies.why_not` that hold at any S (Problem.memo entries)
    memo: dict
    mask: object  # held so that its identity, part of the signature, stays its own
    #: a step the kernel's op serves as it is (`_lean`): (its C step or None, the op, scale,
    #: softcap, the fewest keys "auto" gives it the decode kernel), else None
    lean: tuple | None = None


_PLANS: OrderedDict = OrderedDict()
_TENSOR = torch.Tensor
_MAX_ROWS = decode.MAX_ROWS
#: the C signature of a build loaded in this process (`decode.key_entry`), once one is
_KEY: list = [None]
#: serve(query, key, value, dropout_p, is_causal, scale, enable_gqa, mask, softcap, return_lse)
#: -> out (or (out, lse)) of a step served whole in C (csrc/decode_serve.cpp), else None; None
#: until a plan is kept there (`_table`)
serve = None
_C: list = []  # the table's (serve, keep, clear), once installed


def _key():
    """The C signature function, kept once a build is loaded (None before: Python's)."""
    _KEY[0] = decode.key_entry()
    return _KEY[0]


def find(query, key, value, dropout_p, is_causal, scale, enable_gqa, mask, softcap,
         return_lse):
    """(signature, result): result = out (or (out, lse) with return_lse) of a step of a plan
    kept under the call's S-free signature, or None (the full path runs the call). signature:
    None when the call has none (not three plain tensors, or unhashable)."""
    if not (type(query) is type(key) is type(value) is _TENSOR):
        return None, None
    c_key = _KEY[0] or _key()
    got = c_key(query, key, value, _MAX_ROWS) if c_key is not None else None
    if got is False:  # not decode-shaped: no step plan
        return None, None
    if got is not None:  # the tensors' part in C: one call where ~20 attribute reads were
        sig = (got, dropout_p, is_causal, scale, enable_gqa, id(mask), softcap, return_lse,
               *isa.switches())
    else:
        try:
            qs, ks, vs = query.shape, key.shape, value.shape
            if len(qs) < 2 or qs[-2] > _MAX_ROWS:  # not decode-shaped: no step plan
                return None, None
            sig = (qs, query.stride(), query.dtype, query.device, query.requires_grad,
                   ks[:-2], ks[-1:], key.dtype, key.device, key.requires_grad, vs[:-2], vs[-1:],
                   value.dtype, value.device, value.requires_grad, dropout_p, is_causal, scale,
                   enable_gqa, id(mask), softcap, return_lse, torch.is_grad_enabled(),
                   *isa.switches())
        except (RuntimeError, NotImplementedError):  # a tensor without strides (sparse,
            return None, None  # nested): the full path says what is wrong
    try:
        step = _PLANS.get(sig)
    except TypeError:  # unhashable (a list as scale): the full path says what is wrong
        return None, None
    if step is None:
        return sig, None
    _PLANS.move_to_end(sig)
    lean = step.lean
    if lean is not None:  # every key attended: the op's own (B, H, L, Dv), unless a row read
        # is not finite
        fast, op, scale_, softcap_, least = lean  # the op as a C function: it checks the step
        got = None if fast is None else fast(query, key, value, scale_, softcap_, least)
        if got is None:  # declined (a mode must see the op) or no C step: torch.ops, same checks
            qs, ks, vs = query.shape, key.shape, value.shape
            S = ks[-2]
            if vs[-2] == S and least <= S and ks[0] == qs[0] == vs[0] and \
                    key.stride(-1) == 1 and value.stride(-1) == 1:
                got = op(query, key, value, None, None, None, scale_, softcap_, 0, 0, True)
        if got is not None and got[2]:
            return sig, ((got[0], got[1]) if return_lse else got[0])
    p = _problem(step, query, key, value, is_causal)
    if p is None or not decode.takes(p, return_lse):
        return sig, None
    # dispatch.run("decode", p) but for what a kept plan's call cannot be: sinks, an empty input,
    # a device; its NaN/Inf rules are the decode backend's own (`decode.checked`)
    out, lse = REGISTRY["decode"].checked(p, return_lse)
    return sig, ((out, lse) if return_lse else out)


def kept() -> bool:
    """Whether a step plan is kept (`attention` then asks `find` before the cheap path's probe:
    a step's S-free signature costs less than the probe's call; "auto" gives a step the decode
    kernel or not whatever the cheap path keeps, so the order changes no answer)."""
    return bool(_PLANS)


def _problem(step: Step, query, key, value, is_causal) -> Problem | None:
    """The step's Problem at this call's S, or None where the full path must decide (key and
    value of different lengths, a mask that does not fit (L, S))."""
    S = key.shape[-2]
    if value.shape[-2] != S:
        return None
    t = step.template
    d = t.dims
    dims = Dims(d.batch, d.H, d.Hkv, d.L, S, d.D, d.Dv, d.ndim)
    if d.ndim > 2:  # as make_problem: a key/value batch of 1 serves every query batch element
        query, key, value = (x if x.shape[:-3] == d.batch else x.expand(*d.batch, *x.shape[-3:])
                             for x in (query, key, value))
    structured = None
    if step.mask is not None or is_causal:
        try:
            structured = _structured(step.mask, is_causal, dims)
        except AttnlabError:
            return None
    return Problem(query, key, value, dims, t.scale, t.dropout_p, structured, None, t.softcap,
                   memo=dict(step.memo))


def keep(sig, p: Problem, mask, need_lse: bool = False, is_causal: bool = False) -> None:
    """Keep the step plan of a call that validated and that "auto" gave the decode kernel (its
    tensors dropped: no input is held alive); a call with what a step does not rebuild (a dense
    mask, ALiBi slopes, a score_mod, sinks) keeps none. need_lse, is_causal: the call's
    return_lse and is_causal."""
    if sig is None or p.attn_mask is not None or p.alibi_slopes is not None or \
            p.score_mod is not None or p.sinks is not None:
        return
    template = dataclasses.replace(p, query=None, key=None, value=None, finite=False,
                                   memo={})
    # S-free: the kernel available; without a mask, why_not's checks (a mask's need intervals
    # at S); both under the switches of the signature
    keys = [("kernels.available", None)] + [("kernels.why_not", "decode")] * (p.structured is None)
    memo = {k: p.memo[k] for k in keys if k in p.memo}
    ops = build.get()  # the build these switches choose
    if ops is not None:
        memo[decode.OPS] = ops
    lean = None if is_causal or not _every_key(mask, p.dims.L) else \
        _lean(p, need_lse, memo.get(decode.OPS))
    _PLANS[sig] = Step(template, memo, mask, lean)
    if lean is not None and lean[0] is not None and type(sig[0]) is bytes and _table():
        # served whole in C from the next step: its S-free signature in C, the scalars as given
        # (those it cannot key on exactly stay here), the mask object, the switches of `sig`
        _C[0][1](sig[0], *sig[1:5], mask, *sig[6:10], lean[0], lean[2], lean[3], lean[4])
    while len(_PLANS) > MAX_PLANS:
        _PLANS.popitem(last=False)


def _every_key(mask, L: int) -> bool:
    """The mask leaves the step's rows every key at every cache length S: none, or a bottom-right
    causal mask over one query row (its row sees keys j <= S - 1, `Causal.simplified`: the one
    mask of a decoding step, transformers' and `attnlab.nn`'s). Any other mask, even one that
    leaves every key at the plan's S (its Problem then has none), may not at the next."""
    return mask is None or (type(mask) is Causal and mask.align == "bottom_right" and L == 1)


def _lean(p: Problem, need_lse: bool, ops) -> tuple | None:
    """(C step, op, scale, softcap, least) where a step at any S >= least (`decode.min_keys`:
    where "auto" gives the decode kernel) with unit stride along D is the kernel's op on the
    call's own tensors, exactly as `decode.checked` runs it while every row it reads is finite
    (the op as a C function, `decode.step_entry`, where the build has it): no mask (every row
    attends the whole cache: no intervals; a call given is_causal or a mask other than
    `_every_key`'s has none here), no ALiBi, 4-D inputs (a step whose key/value batch is
    broadcast, as the Problem's is here, takes `_problem`), a contiguous query, no gradient (the
    interval kernel's then); else None (`_problem` and `decode.checked` each step)."""
    d, q, k, v = p.dims, p.query, p.key, p.value  # (the key/value batch broadcast)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if ops is None or p.structured is not None or p.alibi_slopes is not None or d.ndim != 4 or \
            not q.is_contiguous() or grad or q.numel() == 0 or v.shape[-1] == 0:
        return None
    return (decode.step_entry(ops), cheap._raw(ops.decode), float(p.scale),
            float(p.softcap or 0.0), decode.min_keys(p, need_lse))


def _table() -> tuple | None:
    """The C table's (serve, keep, clear) (csrc/decode_serve.cpp), of the build loaded first,
    installed once (`serve` is then its serve; a plan holds its own build's step), or None
    where no build is loaded."""
    fns = _C[0] if _C else build.c_functions("attnlab_decode_serve_entry", isa.ENV,
                                             isa.KERNEL_KEY, isa.ISA_KEY, _MAX_ROWS, MAX_PLANS)
    if fns is not None and not _C:
        _C.append(fns)
        globals()["serve"] = fns[0]
    return fns


def clear() -> None:
    """Forget every step plan, in C too (tests)."""
    _PLANS.clear()
    if _C:
        _C[0][2]()
