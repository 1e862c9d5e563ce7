"""Double backward (a gradient penalty, `autograd.grad(..., create_graph=True)`) on every backend.

A backend's own autograd Function computes its gradients with kernels autograd cannot see into,
so a backward asked to build a graph (`create_graph=True`: grad mode is on inside the backward)
would return gradients with no graph, and the second-order term would silently vanish. Instead,
each such backward (tiled, interval, the sdpa backend's flash kernel) hands over to `grads`:
the same call's forward recomputed with plain differentiable PyTorch ops (the math backend's
arithmetic, (..., H, L, S) scores in memory), and its gradients taken by autograd with
`create_graph=True`. They are exact, and differentiable again, to any order.

Kernels whose backward attnlab does not own (PyTorch's fused SDPA and FlexAttention on a device)
pass their outputs through `no_second_order`, which raises one AttnlabError when a backward
through them is asked to build a graph, instead of PyTorch's raw error or a silent no-graph.

Caution: the recomputation holds the dense scores (the math backend's memory, checked against
`budget.limit()`); dropout cannot be replayed on it, so a call with dropout refuses.
"""

from __future__ import annotations

import torch

from attnlab.errors import AttnlabError
from attnlab.ops import budget


def wanted() -> bool:
    """Inside a backward: it was asked to build a graph (`create_graph=True`)."""
    return torch.is_grad_enabled()


def check(what: str, scores_shape, itemsize: int, dropout_p: float = 0.0) -> None:
    """Refuse what the recomputation cannot do: dropout, or scores past the dense limit."""
    if dropout_p:
        raise AttnlabError(f"dropout_p: double backward through {what} cannot replay its "
                           f"dropout ({dropout_p}); use dropout_p=0 or backend=\"math\"")
    n = budget.entries(scores_shape)
    budget.check("create_graph", f"double backward through {what} (the math path's "
                 "recomputation)", scores_shape, n * (6 * itemsize + 2),
                 "differentiate once, or use smaller calls")


def grads(forward, inputs: tuple, dout, dlse, extra: tuple = ()) -> tuple:
    """Gradients of `forward(*inputs) -> (out, lse)` (differentiable PyTorch ops) for `inputs`
    then `extra` (tensors forward reads itself, e.g. a score_mod's), given dout and dlse (either
    may be None: zero), with a graph for the next order. None for a tensor that needs none.

    Each input is differentiated through its own alias (a view), so one tensor given in two
    places (key as value) gets each place's share, as autograd sums a Function's inputs."""
    with torch.enable_grad():
        slots = [x.view_as(x) if x is not None and x.requires_grad else x for x in inputs]
        wrt = [x for x in (*slots, *extra) if x is not None and x.requires_grad]
        out, lse = forward(*slots)
        pairs = [(t, g) for t, g in ((out, dout), (lse, dlse)) if g is not None]
        got = torch.autograd.grad([t for t, _ in pairs], wrt, [g for _, g in pairs],
                                  create_graph=True, allow_unused=True) if pairs and wrt else ()
    by_id = {id(x): g for x, g in zip(wrt, got)}
    result = []
    for x in (*slots, *extra):
        g = by_id.get(id(x)) if x is not None else None
        if g is None and x is not None and x.requires_grad:
            g = torch.zeros_like(x)  # unused: zero, as autograd's own backward would give
        result.append(g)
    return tuple(result)


class _Refuse(torch.autograd.Function):
    """Identity on (out, lse); its backward refuses to build a graph."""

    @staticmethod
    def forward(ctx, what: str, out, lse):
        ctx.what = what
        ctx.set_materialize_grads(False)
        return (out.view_as(out), lse if lse is None else lse.view_as(lse))

    @staticmethod
    def backward(ctx, dout, dlse):
        if wanted():
            raise AttnlabError(
                f"create_graph: {ctx.what} has no second derivative (its backward is a fused "
                "kernel); for a gradient penalty or another double backward use backend=\"math\""
                " (or \"tiled\" on the CPU)")
        return None, dout, dlse


def no_second_order(what: str, out: torch.Tensor, lse: torch.Tensor | None):
    """(out, lse), unchanged, whose backward raises AttnlabError under create_graph=True; the
    tensors themselves when no gradient is being recorded."""
    tracked = torch.is_grad_enabled() and (
        out.requires_grad or (lse is not None and lse.requires_grad))
    if not tracked:
        return out, lse
    return _Refuse.apply(what, out, lse)
