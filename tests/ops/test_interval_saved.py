"""The interval kernel's autograd Function keeps everything its backward reads where autograd
can see it: saved with `save_for_backward` (so `torch.autograd.graph.saved_tensors_hooks`, which
activation offloading and checkpointing tools use, packs and unpacks all of it), and "were the
inputs finite?" as a non-differentiable output rather than a list passed into apply."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import attnlab
from attnlab.ops import kernels
from attnlab.ops.kernels import gate, kernel
from interval_cases import need_compiler

from helpers import numpy_saved_hooks


@pytest.fixture(autouse=True)
def _kernel():
    need_compiler()
    if not kernels.available():
        pytest.skip("the interval kernel is not available here")


def _inputs(D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 4, 37, D, generator=g).requires_grad_(True) for _ in range(3)]


def _grads(q, k, v, **kw):
    out, lse = attnlab.attention(q, k, v, backend="interval", return_lse=True, **kw)
    return torch.autograd.grad((out * out.cos()).sum() + lse.sum(), (q, k, v))


@pytest.mark.parametrize("D", [16, 13])  # 16: q and v are read in place; 13: padded copies
@pytest.mark.parametrize("kw", [{"is_causal": True}, {"softcap": 3.0, "alibi_slopes":
                                                       torch.tensor([0.5, 0.2, 0.1, 0.0])}])
def test_hooks_see_every_tensor_the_backward_reads(D, kw):
    """Pack hooks move every saved tensor to a fake storage (a NumPy copy) and the inputs are
    then overwritten: the backward still gives the clean gradients, so it read nothing else."""
    q, k, v = _inputs(D)
    want = _grads(q, k, v, **kw)
    hooks, store = numpy_saved_hooks()
    with hooks:
        out, lse = attnlab.attention(q, k, v, backend="interval", return_lse=True, **kw)
    assert type(out.grad_fn).__name__ == "IntervalAttentionBackward", out.grad_fn
    with torch.no_grad():
        for x in (q, k, v):
            x.fill_(float("nan"))  # anything read past the hooks shows
    got = torch.autograd.grad((out * out.cos()).sum() + lse.sum(), (q, k, v))
    assert len(store) >= 5
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def _tensors_in(x, depth=0):
    """Tensors reachable from x's attributes, dataclass fields and containers."""
    if isinstance(x, torch.Tensor):
        yield x
    elif depth < 4 and dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            yield from _tensors_in(getattr(x, f.name), depth + 1)
    elif depth < 4 and isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors_in(y, depth + 1)
    elif depth < 4 and isinstance(x, dict):
        for y in x.values():
            yield from _tensors_in(y, depth + 1)


def test_ctx_holds_no_tensor_outside_saved_tensors():
    q, k, v = _inputs(13)
    out = attnlab.attention(q, k, v, is_causal=True, alibi_slopes=torch.ones(4),
                            backend="interval")
    ctx = out.grad_fn
    hidden = [name for name, val in vars(ctx).items() if any(True for _ in _tensors_in(val))]
    assert hidden == [], f"ctx keeps tensors out of autograd's sight: {hidden}"


def test_finite_flag_is_a_non_differentiable_output():
    q, k, v = _inputs(16)
    lo = torch.zeros(1, 1, 37, dtype=torch.int32)
    hi = torch.full((1, 1, 37), 37, dtype=torch.int32)
    c = gate.check(q, k, v, lo, hi, scale=0.25)
    out, lse, finite = kernel.IntervalAttention.apply(q, k, v, c, None, True)
    assert finite.dtype == torch.bool and bool(finite) and not finite.requires_grad
    assert out.requires_grad and lse.requires_grad
    with torch.no_grad():
        k[0, 1, 5, 2] = float("nan")
    out, lse, finite = kernel.IntervalAttention.apply(q, k, v, c, None, True)
    assert not bool(finite) and not out.requires_grad
