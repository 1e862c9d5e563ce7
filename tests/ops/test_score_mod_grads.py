"""Tensors a score_mod reads that need a gradient get it on every backend that runs a score_mod,
or that backend refuses with one AttnlabError: never a silent None (a relative-position table
that never trains). Checked against backend="math" (autograd through every op) in float64."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks

H = 4


def _inputs(L=29, S=37, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, H, n, 8, generator=g, dtype=torch.float64).to(dtype)
                 .requires_grad_(True) for n in (L, S, S))


class RelBias(torch.nn.Module):
    """T5/Swin-style learned relative-position bias, read by a bound method."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(64, H, dtype=torch.float64))

    def score_mod(self, s, b, h, q, k):
        return s + self.table[(q - k).clamp(-31, 31) + 32, h]


GLOBAL_TABLE = torch.randn(128, dtype=torch.float64, requires_grad=True)


def global_mod(s, b, h, q, k):  # reads a module-level tensor
    return s + GLOBAL_TABLE[(k - q).clamp(-63, 63) + 64]


def _cases():
    """name -> (make() -> (score_mod, the tensors whose gradient the test compares))."""
    def module():
        m = RelBias()
        return m.score_mod, [m.table]

    def closure_non_leaf():  # a tensor computed from a parameter, read through a closure
        w = torch.randn(H, dtype=torch.float64, requires_grad=True)
        scale = w.exp() * 0.5
        return (lambda s, b, h, q, k: s * scale[h] - 0.01 * (q - k).abs()), [w]

    def nonlinear():  # the captured tensor inside a non-linear function of the score
        c = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
        return (lambda s, b, h, q, k: c * torch.tanh(s / c)), [c]

    def global_table():
        return global_mod, [GLOBAL_TABLE]

    return {"module": module, "closure_non_leaf": closure_non_leaf, "nonlinear": nonlinear,
            "global_table": global_table}


def _grads(backend, make, mask):
    torch.manual_seed(0)
    fn, params = make()
    q, k, v = _inputs()
    out, lse = attnlab.attention(q, k, v, mask=mask, score_mod=fn, backend=backend,
                                 return_lse=True)
    loss = (out * out.cos()).sum() + (lse * 0.3).sum()
    return torch.autograd.grad(loss, (q, k, v, *params), allow_unused=True)


@pytest.mark.parametrize("case", list(_cases()))
@pytest.mark.parametrize("backend", ["auto", "tiled", "sdpa"])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_captured_tensors_get_gradients(case, backend, mask):
    m = masks.causal("bottom_right") if mask else None
    make = _cases()[case]
    want = _grads("math", make, m)
    got = _grads(backend, make, m)
    for i, (g, w) in enumerate(zip(got, want)):
        assert w is not None and g is not None, f"input {i}: gradient None"
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=f"input {i}")


def test_captured_gradient_through_backward_accumulates():
    """loss.backward() fills the table's .grad, as on math."""
    grads = []
    for backend in ("math", "tiled"):
        torch.manual_seed(1)
        m = RelBias()
        q, k, v = _inputs(seed=3)
        attnlab.attention(q, k, v, score_mod=m.score_mod, backend=backend).square().sum().backward()
        grads.append(m.table.grad)
    assert grads[1] is not None
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-10, atol=1e-10)


def test_bf16_captured_gradient_within_rule():
    """The FlashAttention rule for gradients: tiled's table gradient in bf16 is within 3x the
    plain bf16 implementation's (math) error against float64 on the same rounded inputs."""
    m = RelBias()
    q, k, v = (x.detach().to(torch.bfloat16) for x in _inputs())
    got = {}
    for backend, dtype in (("math", torch.float64), ("math", torch.bfloat16),
                           ("tiled", torch.bfloat16)):
        m.table.grad = None
        x = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
        out = attnlab.attention(*x, score_mod=m.score_mod, backend=backend, is_causal=True)
        (out.double() * torch.linspace(-1, 1, out.shape[-1], dtype=torch.float64)).sum().backward()
        got[backend, dtype] = m.table.grad.clone()
    ref = got["math", torch.float64]
    err = {key: float((g - ref).abs().max()) for key, g in got.items()}
    assert err["tiled", torch.bfloat16] <= 3 * err["math", torch.bfloat16] + 1e-3, err


@pytest.mark.parametrize("backend", ["reference", "flex"])
def test_backends_without_that_gradient_refuse(backend):
    if backend == "flex" and not __import__("attnlab.ops.flex", fromlist=["x"]).available():
        pytest.skip("no FlexAttention in this torch")
    m = RelBias()
    q, k, v = (x.detach() for x in _inputs())
    with pytest.raises(AttnlabError, match=r"backend|score_mod"):
        attnlab.attention(q, k, v, score_mod=m.score_mod, backend=backend)
    with torch.no_grad():  # nothing to differentiate: runs
        attnlab.attention(q, k, v, score_mod=m.score_mod, backend="reference")
