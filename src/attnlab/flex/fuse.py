"""A score_mod that is exactly one of attnlab's built-in modifiers runs as that modifier.

attnlab's kernels apply soft-capping and ALiBi inside their score loop (`softcap=`,
`alibi_slopes=`; the interval kernel runs them ~5× faster than the tiled loop calling a
score_mod on each chunk, `benchmarks/flex.py`'s notes). A Flex score_mod written as one of them
is recognised from its graph (torch.fx traces it once, symbolically), never from its numbers:

    softcap   c * tanh(score / c)                       (c a positive number; either operand order)
    ALiBi     score + (kv_idx - q_idx) * g(h)           (g reads only h; either operand order)
    both      c * tanh(score / c) + (kv_idx - q_idx) * g(h)   (attnlab's order: softcap first)

The slopes are g at every query head, computed by calling the function itself at q_idx = 0,
kv_idx = 1 (in its broadcast or vmap form, `attnlab.flexfn`). Anything else — another graph, a
function torch.fx cannot trace, slopes that need a gradient — stays a score_mod.
"""

from __future__ import annotations

import operator

import torch

#: what a traced node's target may be for each operation
_DIV = {operator.truediv, torch.div, torch.true_divide, "div", "true_divide", "__truediv__"}
_MUL = {operator.mul, torch.mul, "mul", "__mul__"}
_ADD = {operator.add, torch.add, "add", "__add__"}
_SUB = {operator.sub, torch.sub, "sub", "__sub__"}
_TANH = {torch.tanh, "tanh"}


def builtin_of(fn, adapted, H: int, dtype, device) -> dict | None:
    """{"softcap": c} and/or {"alibi_slopes": (H,) tensor} when fn's graph is exactly one of the
    built-in modifiers (see the module docstring), else None."""
    try:
        graph = torch.fx.symbolic_trace(fn).graph
    except Exception:
        return None
    nodes = list(graph.nodes)
    args = [n for n in nodes if n.op == "placeholder"]
    out = next((n for n in nodes if n.op == "output"), None)
    if len(args) != 5 or out is None or not isinstance(out.args[0], torch.fx.Node):
        return None
    score, _, h, q, kv = args
    top = out.args[0]
    cap = _softcap(top, score)
    if cap is not None:
        return {"softcap": cap}
    if not _is(top, _ADD) or len(top.args) != 2:
        return None
    for base, bias in (top.args, top.args[::-1]):
        found = {} if base is score else None
        if found is None and isinstance(base, torch.fx.Node):
            c = _softcap(base, score)
            found = None if c is None else {"softcap": c}
        if found is not None and _alibi(bias, h, q, kv):
            slopes = _slopes(adapted, H, dtype, device, found.get("softcap"))
            if slopes is None:
                return None
            return {**found, "alibi_slopes": slopes}
    return None


def _is(node, ops) -> bool:
    return isinstance(node, torch.fx.Node) and node.op in ("call_function", "call_method") \
        and node.target in ops and not node.kwargs


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _softcap(node, score) -> float | None:
    """c when node is c * tanh(score / c), else None."""
    if not _is(node, _MUL) or len(node.args) != 2:
        return None
    for t, c in (node.args, node.args[::-1]):
        c = _number(c)
        if c is None or c <= 0 or not _is(t, _TANH) or len(t.args) != 1:
            continue
        d = t.args[0]
        if _is(d, _DIV) and len(d.args) == 2 and d.args[0] is score and _number(d.args[1]) == c:
            return c
    return None


def _alibi(node, h, q, kv) -> bool:
    """node is (kv - q) * g or g * (kv - q), g reading no input but h."""
    if not _is(node, _MUL) or len(node.args) != 2:
        return False
    for rel, g in (node.args, node.args[::-1]):
        if _is(rel, _SUB) and tuple(rel.args) == (kv, q) and isinstance(g, torch.fx.Node) \
                and _inputs(g) <= {h}:
            return True
    return False


def _inputs(node) -> set:
    """The placeholders node depends on."""
    seen, todo, found = set(), [node], set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            found.add(n)
        todo.extend(a for a in n.all_input_nodes)
    return found


def _slopes(adapted, H: int, dtype, device, cap) -> torch.Tensor | None:
    """g(h) for h = 0..H-1 from the function itself at q_idx = 0, kv_idx = 1 (score 0, so a
    softcap first adds c·tanh(0) = 0); None when they need a gradient or are not finite."""
    z = torch.zeros(1, 1, 1, 1, dtype=torch.int64, device=device)
    h = torch.arange(H, device=device)[None, :, None, None]  # (1, H, 1, 1)
    with torch.no_grad():
        got = adapted(torch.zeros(1, H, 1, 1, dtype=dtype, device=device), z, h, z, z + 1)
    with torch.enable_grad():  # a learned slope: the kernels give it no gradient
        needs = adapted(torch.zeros(1, H, 1, 1, dtype=dtype, device=device), z, h, z,
                        z + 1).requires_grad
    if needs or not isinstance(got, torch.Tensor) or not bool(torch.isfinite(got).all()):
        return None
    return got.reshape(-1).expand(H).to(dtype).clone()
