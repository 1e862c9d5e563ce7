"""The tensors a score_mod reads that need a gradient (a learned relative-position table).

FlexAttention finds them by tracing the function (torch.compile lifts every tensor it closes
over) and its backward returns their gradients. The math backend gets them from autograd for
free. A backend with its own autograd Function (the tiled kernel) must name them as inputs of
its Function, or autograd never asks it for their gradients and they stay None — silently.

`of(problem)` finds them in two steps:

1. Candidates, by looking inside the function: its closure cells, the globals its code names,
   its defaults, the object of a bound method or a callable object (an `nn.Module`'s parameters
   and buffers, an object's attributes), a `functools.partial`'s arguments, and the same inside
   the functions and containers found there (a few levels deep).
2. The truth, from autograd: the function is called once on one pair (every index 0, a 1-element
   score) with gradients on, and its result's graph is walked back. Every path must end at a
   candidate (a non-leaf candidate stops the walk at its own graph node, so nothing upstream of
   it is re-run) or at a leaf tensor that needs a gradient (a parameter read some other way:
   taken as it is). The tensors returned are those the walk reached, in the order it reached
   them. A function the one-pair probe cannot run gets every candidate of step 1.

Caution: a tensor the function reads only on some pairs (behind a Python `if`) is found only if
the probe's pair reaches it; FlexAttention forbids such control flow too. The probe costs one
call of the function on one element, and only when gradients are enabled.
"""

from __future__ import annotations

import functools
import types

import torch

#: how deep the search follows functions, objects and containers from the score_mod
DEPTH = 4


def of(p) -> tuple[torch.Tensor, ...]:
    """The tensors needing a gradient that p.score_mod reads (empty without one, or when
    gradients are off); computed once per Problem."""
    fn = p.score_mod
    if fn is None or not torch.is_grad_enabled():
        return ()
    key = ("captured", None)
    if key not in p.memo:
        p.memo[key] = _reached(fn, _candidates(fn), p.query.device,
                               torch.float64 if p.query.dtype == torch.float64 else torch.float32)
    return p.memo[key]


def _candidates(fn) -> dict[int, torch.Tensor]:
    """id -> tensor for every tensor needing a gradient found inside fn (step 1)."""
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()

    def visit(x, depth: int) -> None:
        if depth > DEPTH or id(x) in seen or isinstance(x, (str, bytes, int, float, bool,
                                                             type(None), types.ModuleType)):
            return
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            if x.requires_grad:
                found[id(x)] = x
            return
        if isinstance(x, torch.nn.Module):
            for t in (*x.parameters(), *x.buffers()):
                visit(t, depth)
            return
        if isinstance(x, functools.partial):
            for y in (x.func, *x.args, *x.keywords.values()):
                visit(y, depth + 1)
            return
        if isinstance(x, types.MethodType):
            visit(x.__self__, depth + 1)
            visit(x.__func__, depth + 1)
            return
        if isinstance(x, types.FunctionType):
            for y in _function_parts(x):
                visit(y, depth + 1)
            return
        if isinstance(x, dict):
            for y in x.values():
                visit(y, depth + 1)
            return
        if isinstance(x, (list, tuple, set, frozenset)):
            for y in x:
                visit(y, depth + 1)
            return
        attrs = getattr(x, "__dict__", None)
        if isinstance(attrs, dict):  # a callable object (masks.alibi's ALiBi), a dataclass
            for y in attrs.values():
                visit(y, depth + 1)
            call = vars(type(x)).get("__call__")
            if isinstance(call, types.FunctionType):
                visit(call, depth + 1)

    visit(fn, 0)
    return found


def _function_parts(f: types.FunctionType):
    """What a plain function can read: closure cells, named globals, defaults."""
    for cell in f.__closure__ or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue
    for name in _names(f.__code__):
        if name in f.__globals__:
            yield f.__globals__[name]
    yield from f.__defaults__ or ()
    yield from (f.__kwdefaults__ or {}).values()


def _names(code: types.CodeType):
    """Global names a code object and the code objects nested in it refer to."""
    yield from code.co_names
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _names(c)


def _reached(fn, found: dict[int, torch.Tensor], device, dtype) -> tuple[torch.Tensor, ...]:
    """The candidates and leaves the graph of fn on one probe pair reaches (step 2)."""
    by_node = {t.grad_fn: t for t in found.values() if t.grad_fn is not None}  # non-leaves
    idx = torch.zeros((1, 1, 1, 1), dtype=torch.int64, device=device)  # b, h, q_idx, kv_idx = 0
    try:
        with torch.enable_grad():
            out = fn(torch.zeros((1, 1, 1, 1), dtype=dtype, device=device), idx, idx, idx, idx)
    except Exception:  # a function that needs the call's shapes: every candidate, unwalked
        return tuple(found.values())
    root = getattr(out, "grad_fn", None)
    if root is None:
        return ()
    reached: dict[int, torch.Tensor] = {}
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        t = by_node.get(node)
        if t is None and hasattr(node, "variable"):  # a leaf (AccumulateGrad's tensor)
            t = node.variable
        if t is not None:
            reached.setdefault(id(t), t)
            continue
        stack.extend(nxt for nxt, _ in node.next_functions)
    return tuple(reached.values())

