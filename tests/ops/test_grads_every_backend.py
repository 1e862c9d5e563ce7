"""Every catalogued backend (tests/catalog.py, so a new backend is checked as soon as it is
listed) either gives the gradients autograd through the math backend gives, or refuses with one
AttnlabError — never a silent None or a gradient without a graph:

- the tensors a score_mod reads that need a gradient (a learned relative-position table);
- double backward (a gradient penalty through `create_graph=True`);
- learned attention sinks, their gradient included.
"""

from __future__ import annotations

import pytest
import torch

import attnlab
import catalog
from attnlab import AttnlabError, masks

H, HKV, L, S = 4, 2, 21, 27


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, H, L, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, HKV, S, 16, generator=g, dtype=torch.float64) for _ in range(2))
    return [x.to(dtype).requires_grad_(True) for x in (q, k, v)]


def _dtype(backend):
    return torch.float64 if torch.float64 in backend.dtypes else torch.float32


def _tol(dtype):
    return dict(rtol=1e-9, atol=1e-10) if dtype == torch.float64 else dict(rtol=2e-4, atol=2e-5)


def _attention(name, *args, **kw):
    return attnlab.attention(*args, mask=masks.causal("bottom_right"), enable_gqa=True,
                             backend=name, **kw)


def _agrees_with_math(backend, monkeypatch, dtype, run):
    """run(name) -> grads: the forward through backend `name` (an AttnlabError here is its
    refusal, allowed but for math), returning a function that computes its gradients; the
    backend's gradients equal math's, none of them None."""
    for key, value in backend.env.items():
        monkeypatch.setenv(key, value)
    grads = {}
    for name in ("math", backend.name):
        try:
            grads_of = run(name)
        except AttnlabError:
            assert name != "math"
            return  # refused with one AttnlabError: allowed
        grads[name] = grads_of()
    for g, w in zip(grads[backend.name], grads["math"]):
        assert g is not None, "a gradient is None"
        torch.testing.assert_close(g, w, **_tol(dtype))


@pytest.mark.parametrize("backend", catalog.backends(), ids=lambda b: b.name)
def test_score_mod_table_gradient(backend, monkeypatch):
    dtype = _dtype(backend)
    table = torch.linspace(-1, 1, 64, dtype=dtype).requires_grad_(True)

    def rel(s, b, h, q, k):
        return s + table[(q - k).clamp(-32, 31) + 32]

    def run(name):
        q, k, v = _inputs(dtype)
        out = _attention(name, q, k, v, score_mod=rel)
        return lambda: torch.autograd.grad(out.sin().sum(), (q, k, v, table), allow_unused=True)

    _agrees_with_math(backend, monkeypatch, dtype, run)


@pytest.mark.parametrize("backend", catalog.backends(), ids=lambda b: b.name)
def test_double_backward(backend, monkeypatch):
    dtype = _dtype(backend)

    def run(name):
        q, k, v = _inputs(dtype)
        gq, = torch.autograd.grad(_attention(name, q, k, v).sin().sum(), q, create_graph=True)

        def second():
            assert gq.grad_fn is not None, "the first gradient has no graph"
            return torch.autograd.grad(gq.square().sum(), (q, k, v))
        return second

    _agrees_with_math(backend, monkeypatch, dtype, run)


@pytest.mark.parametrize("backend", catalog.backends(), ids=lambda b: b.name)
def test_sinks_gradient(backend, monkeypatch):
    dtype = _dtype(backend)

    def run(name):
        q, k, v = _inputs(dtype)
        sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=dtype, requires_grad=True)
        out, lse = _attention(name, q, k, v, sinks=sinks, return_lse=True)
        return lambda: torch.autograd.grad(out.sin().sum() + lse.sum(), (q, k, v, sinks))

    _agrees_with_math(backend, monkeypatch, dtype, run)
