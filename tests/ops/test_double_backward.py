"""Double backward (a gradient penalty: autograd.grad(..., create_graph=True), then backward
through that gradient) works on every CPU backend that has a backward, exactly as the math
backend's autograd gives it, or raises one AttnlabError: never a gradient with no graph, whose
second-order term would silently vanish."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks
from attnlab.ops import dispatch, flex, second_order
from attnlab.ops.validate import make_problem


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


TABLE = torch.linspace(-1.0, 1.0, 64, dtype=torch.float64)

MASKS = {
    "none": lambda: {},
    "causal": lambda: {"is_causal": True},
    "window": lambda: {"mask": masks.causal("bottom_right") & masks.sliding_window(5)},
    "padding": lambda: {"mask": masks.padding(key_lengths=[11, 7])},
    "softcap_alibi": lambda: {"is_causal": True, "softcap": 2.0,
                              "alibi_slopes": torch.tensor([0.5, 0.25, 0.1, 0.05])},
    "dense_mask": lambda: {"attn_mask": torch.rand(13, 11, generator=_gen(5)) > 0.3},
}


def _inputs(dtype, Hkv=4, seed=0, L=13, S=11):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, L, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, Hkv, S, 8, generator=g, dtype=torch.float64) for _ in range(2))
    return [x.to(dtype).requires_grad_(True) for x in (q, k, v)]


def _penalty_grads(backend, dtype, kw, Hkv=4, extra=(), with_lse=True):
    """d/d(q, k, v, *extra) of a loss plus the squared norm of its gradient to q and k."""
    q, k, v = _inputs(dtype, Hkv)
    out, lse = attnlab.attention(q, k, v, backend=backend, return_lse=True,
                                 enable_gqa=Hkv != 4, **kw)
    loss = (out * out.sin()).sum() + (lse.sum() * 0.2 if with_lse else 0)
    gq, gk = torch.autograd.grad(loss, (q, k), create_graph=True)
    assert gq.grad_fn is not None and gk.grad_fn is not None, "first gradient has no graph"
    pen = loss + gq.square().sum() + (gk * gk.cos()).sum()
    return torch.autograd.grad(pen, (q, k, v, *extra), allow_unused=True)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("backend", ["auto", "sdpa", "tiled"])
@pytest.mark.parametrize("Hkv", [4, 2])
def test_second_order_float64_matches_math(mask, backend, Hkv):
    want = _penalty_grads("math", torch.float64, MASKS[mask](), Hkv)
    got = _penalty_grads(backend, torch.float64, MASKS[mask](), Hkv)
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9, msg=f"input {i}")


@pytest.mark.parametrize("mask", ["none", "causal", "window", "softcap_alibi"])
@pytest.mark.parametrize("backend", ["auto", "interval", "tiled", "sdpa"])
def test_second_order_float32_interval_kernel_and_flash(mask, backend):
    """float32: the interval kernel ("interval", and "auto" on interval-shaped calls), the tiled
    loop and the flash kernel ("sdpa") hand the second order to the math recomputation."""
    want = _penalty_grads("math", torch.float64, MASKS[mask]())
    got = _penalty_grads(backend, torch.float32, MASKS[mask]())
    plain = _penalty_grads("math", torch.float32, MASKS[mask]())
    for i, (g, w, p) in enumerate(zip(got, want, plain)):
        err, err_plain = float((g.double() - w).abs().max()), float((p.double() - w).abs().max())
        assert err <= 3 * err_plain + 1e-5, (i, err, err_plain)


def test_second_order_reaches_score_mod_tables():
    table = TABLE.clone().requires_grad_(True)

    def fn(s, b, h, q, k):
        return s + table[(q - k).clamp(-32, 31) + 32]

    want = _penalty_grads("math", torch.float64, {"score_mod": fn, "is_causal": True},
                          extra=(table,))
    got = _penalty_grads("tiled", torch.float64, {"score_mod": fn, "is_causal": True},
                         extra=(table,))
    for i, (g, w) in enumerate(zip(got, want)):
        assert g is not None, f"input {i}: None"
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9, msg=f"input {i}")


def test_first_order_through_create_graph_equals_plain_backward():
    """The recomputation's first gradient equals the kernel's own (interval kernel, float32)."""
    q, k, v = _inputs(torch.float32)
    out = attnlab.attention(q, k, v, is_causal=True, backend="interval")
    g1 = torch.autograd.grad(out.square().sum(), (q, k, v), create_graph=True)
    out = attnlab.attention(q, k, v, is_causal=True, backend="interval")
    g0 = torch.autograd.grad(out.square().sum(), (q, k, v))
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_key_given_as_value_counts_each_place_once():
    q, k, _ = _inputs(torch.float64)
    grads = []
    for backend in ("math", "tiled"):
        out = attnlab.attention(q, k, k, backend=backend, is_causal=True)
        g, = torch.autograd.grad(out.sin().sum(), k, create_graph=True)
        grads.append(torch.autograd.grad(g.square().sum(), k)[0])
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-9, atol=1e-9)


def test_dropout_refuses_double_backward_on_tiled():
    q, k, v = _inputs(torch.float64)
    out = attnlab.attention(q, k, v, dropout_p=0.2, backend="tiled", is_causal=True)
    with pytest.raises(AttnlabError, match="dropout_p: double backward"):
        torch.autograd.grad(out.sum(), q, create_graph=True)


def test_device_kernels_refuse_with_one_error():
    """Kernels whose backward attnlab does not own refuse a graph with AttnlabError; a plain
    backward through them is untouched."""
    x = torch.randn(3, requires_grad=True)
    out, lse = second_order.no_second_order('backend "sdpa" on a device', x * 2, x.exp())
    with pytest.raises(AttnlabError, match="create_graph: backend \"sdpa\" on a device"):
        torch.autograd.grad((out + lse).sum(), x, create_graph=True)
    out, lse = second_order.no_second_order("x", x * 2, x.exp())
    g, = torch.autograd.grad((out + lse).sum(), x)
    torch.testing.assert_close(g, 2 + x.exp())


@pytest.mark.slow  # ~5 s: importing FlexAttention's BlockMask
def test_flex_on_a_device_refuses(monkeypatch):
    """The device path of backend "flex" (walked on meta tensors, its kernel a differentiable
    stand-in) refuses a double backward."""
    monkeypatch.setattr(dispatch, "on_device", lambda p: True)
    monkeypatch.setattr(flex, "run_kernel", lambda fn, q, k, v, need_lse, **kw: (
        q * 2.0, q.sum(-1).float() if need_lse else None))
    q = torch.zeros(1, 2, 8, 4)
    p = make_problem(q, q, q, None, 0.0, False, None, False, mask=masks.causal())
    meta = torch.zeros(1, 2, 8, 4, device="meta", requires_grad=True)
    p = dataclasses.replace(p, query=meta, key=meta, value=meta)
    out, lse = flex.forward(p, True)
    with pytest.raises(AttnlabError, match='create_graph: backend "flex"'):
        torch.autograd.grad(out.sum() + lse.sum(), meta, create_graph=True)
