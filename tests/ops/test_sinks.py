"""Learned attention sinks (`sinks=`, GPT-OSS): one extra logit per head in each row's softmax,
with no value. Every backend against the eager definition in float64 (transformers' GPT-OSS:
the sink logit concatenated to the scores, softmax, the sink's column dropped), forward, lse,
gradients (the sinks' too), weights on demand, rows with nothing to attend, and the
FlashAttention rule in bf16."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks
from attnlab.ops import kernels
from attnlab.ops.api import attention_with_weights

from helpers import assert_fa_rule

H, HKV = 4, 2


def eager(q, k, v, sinks, allowed=None, scale=None):
    """(out, lse with the sink, weights): transformers' eager GPT-OSS attention, any dtype."""
    if q.dim() > 2:  # grouped heads by repetition
        G = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(G, -3), v.repeat_interleave(G, -3)
    s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    t = sinks.reshape(-1, 1, 1) if s.dim() > 2 else sinks.reshape(1, 1)  # (H, 1, 1) or (1, 1)
    t = t.to(s.dtype).expand(*s.shape[:-1], 1)  # -> (..., H, L, 1)
    c = torch.cat([s, t], -1)  # (..., H, L, S + 1)
    c = c - c.amax(-1, keepdim=True)
    w = torch.softmax(c, -1)[..., :-1]  # the sink's column dropped
    lse = torch.logsumexp(torch.cat([s, t], -1), -1)
    return w.to(v.dtype) @ v, lse, w


MASKS = {
    "none": lambda: None,
    "causal_br": lambda: masks.causal("bottom_right"),
    "window": lambda: masks.causal("bottom_right") & masks.sliding_window(6),
    "padding_empty_rows": lambda: masks.padding(key_lengths=[23, 0]),  # batch 1: no keys
}


def _inputs(dtype=torch.float64, L=19, S=23, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, L, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, HKV, S, 16, generator=g, dtype=torch.float64) for _ in range(2))
    sinks = torch.randn(H, generator=g, dtype=torch.float64) * 2
    return [x.to(dtype) for x in (q, k, v, sinks)]


def _run(backend, xs, mask, grad=True):
    xs = [x.clone().requires_grad_(grad) for x in xs]
    out, lse = attnlab.attention(*xs[:3], mask=mask, sinks=xs[3], backend=backend,
                                 enable_gqa=True, return_lse=True)
    grads = None
    if grad:
        grads = torch.autograd.grad((out * out.sin()).sum() + (0.3 * lse).sum(), xs)
    return out, lse, grads


def _want(xs, mask):
    xs = [x.double().clone().requires_grad_(True) for x in xs]
    L, S = xs[0].shape[-2], xs[1].shape[-2]
    allowed = None if mask is None else mask.to_dense(L, S)
    out, lse, w = eager(*xs, allowed)
    grads = torch.autograd.grad((out * out.sin()).sum() + (0.3 * lse).sum(), xs)
    return out.detach(), lse.detach(), grads, w.detach()


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("backend", ["auto", "math", "sdpa", "tiled"])
def test_float64_every_backend_matches_eager(backend, mask):
    xs = _inputs()
    want_out, want_lse, want_g, _ = _want(xs, MASKS[mask]())
    out, lse, grads = _run(backend, xs, MASKS[mask]())
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-12)
    for name, g, w in zip(["q", "k", "v", "sinks"], grads, want_g):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11, msg=name)


@pytest.mark.parametrize("mask", list(MASKS))
def test_reference_backend_forward(mask):
    xs = _inputs()
    want_out, want_lse, _, _ = _want(xs, MASKS[mask]())
    with torch.no_grad():
        out, lse, _ = _run("reference", xs, MASKS[mask](), grad=False)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("backend", ["interval", "auto", "tiled", "sdpa"])
def test_float32_within_the_rule(backend, mask):
    """float32, the interval kernel included: FlashAttention's rule against the plain float32
    eager definition (error vs float64 at most 2x, gradients 3x)."""
    if backend == "interval" and not kernels.available():
        pytest.skip("the interval kernel is not available here")
    xs = _inputs(torch.float32)
    want_out, want_lse, want_g, _ = _want(xs, MASKS[mask]())
    plain = [x.clone().requires_grad_(True) for x in xs]
    m = MASKS[mask]()
    allowed = None if m is None else m.to_dense(19, 23)
    p_out, p_lse, _ = eager(*plain, allowed)
    p_g = torch.autograd.grad((p_out * p_out.sin()).sum() + (0.3 * p_lse).sum(), plain)
    out, lse, grads = _run(backend, xs, m)
    assert_fa_rule(out, p_out, want_out, 2, torch.float32)
    assert_fa_rule(lse, p_lse, want_lse, 2, torch.float32, what="lse")
    for name, g, p, w in zip(["q", "k", "v", "sinks"], grads, p_g, want_g):
        assert_fa_rule(g, p, w, 3, torch.float32, what=f"d{name}")


@pytest.mark.parametrize("backend", ["auto", "interval", "tiled", "sdpa"])
def test_bf16_rule_at_several_key_chunks(backend):
    """bf16 at L = S = 300 (several key chunks and row blocks), causal."""
    if backend == "interval" and not kernels.available():
        pytest.skip("the interval kernel is not available here")
    xs = _inputs(torch.bfloat16, L=300, S=300, seed=2)
    m = masks.causal()
    allowed = m.to_dense(300, 300)
    ref = [x.double().requires_grad_(True) for x in xs]
    plain = [x.clone().requires_grad_(True) for x in xs]
    dout = torch.randn(2, H, 300, 16, generator=torch.Generator().manual_seed(3))
    r_out, _, _ = eager(*ref, allowed)
    r_out.backward(dout.double())
    p_out, _, _ = eager(*plain, allowed)
    p_out.backward(dout.bfloat16())
    got = [x.clone().requires_grad_(True) for x in xs]
    out = attnlab.attention(*got[:3], mask=m, sinks=got[3], backend=backend, enable_gqa=True)
    out.backward(dout.bfloat16())
    assert_fa_rule(out, p_out, r_out.detach(), 2, torch.bfloat16)
    for name, g, p, r in zip(["q", "k", "v", "sinks"], got, plain, ref):
        assert_fa_rule(g.grad, p.grad, r.grad, 3, torch.bfloat16, what=f"d{name}")


@pytest.mark.parametrize("backend", ["auto", "math", "sdpa", "tiled", "interval"])
def test_rows_with_nothing_to_attend(backend):
    """The sink takes all the mass: output 0, lse = the sink, gradients 0 to q, k, v, d(sink)
    = the lse's gradient; never NaN."""
    if backend == "interval" and not kernels.available():
        pytest.skip("the interval kernel is not available here")
    q, k, v, sinks = (x.float().requires_grad_(True) for x in _inputs())
    m = masks.padding(key_lengths=[0, 0])
    out, lse = attnlab.attention(q, k, v, mask=m, sinks=sinks, backend=backend,
                                 enable_gqa=True, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out))
    torch.testing.assert_close(lse, sinks.detach()[:, None].expand(2, H, 19))
    g = torch.autograd.grad(out.sum() + (lse * 2).sum(), (q, k, v, sinks))
    for x in g[:3]:
        assert torch.equal(x, torch.zeros_like(x))
    torch.testing.assert_close(g[3], torch.full((H,), 2.0 * 2 * 19))


@pytest.mark.parametrize("mask", ["causal_br", "padding_empty_rows"])
def test_weights_on_demand_are_the_sinks(mask):
    xs = _inputs()
    *_, want_w = _want(xs, MASKS[mask]())
    _, lse, w = attention_with_weights(*xs[:3], mask=MASKS[mask](), sinks=xs[3],
                                         enable_gqa=True, return_lse=True)
    torch.testing.assert_close(w, want_w, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w.sum(-1), 1 - torch.exp(xs[3][:, None] - lse))
    w2 = attnlab.attention_weights(xs[0], xs[1], lse, mask=MASKS[mask](), enable_gqa=True)
    torch.testing.assert_close(w2, want_w, rtol=1e-10, atol=1e-12)


def test_double_backward_with_sinks():
    grads = []
    for backend in ("math", "tiled", "sdpa"):
        q, k, v, sinks = (x.clone().requires_grad_(True) for x in _inputs())
        out = attnlab.attention(q, k, v, sinks=sinks, is_causal=True, backend=backend,
                                enable_gqa=True)
        gq, = torch.autograd.grad(out.sin().sum(), q, create_graph=True)
        grads.append(torch.autograd.grad(gq.square().sum(), (q, k, v, sinks)))
    for got in grads[1:]:
        for g, w in zip(got, grads[0]):
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11)


def test_two_and_three_dim_inputs():
    """(L, D) inputs take one sink (H = 1); (H, L, D) one per head."""
    q, k, v, sinks = _inputs()
    causal = torch.ones(19, 23, dtype=torch.bool).tril(4)  # bottom-right causal, L=19, S=23
    for q2, k2, v2, t in ((q[0, 0], k[0, 0], v[0, 0], sinks[:1]),
                          (q[0, :2], k[0], v[0], sinks[:2])):
        out, lse = attnlab.attention(q2, k2, v2, sinks=t, mask=masks.causal("bottom_right"),
                                     return_lse=True)
        want, want_lse, _ = eager(q2, k2, v2, t, causal)
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(lse, want_lse)


def test_sinks_choose_as_an_lse_request():
    q, k, v, sinks = _inputs(torch.float32)
    with_sinks = attnlab.select_backend(q, k, v, enable_gqa=True, sinks=sinks)
    with_lse = attnlab.select_backend(q, k, v, enable_gqa=True, return_lse=True)
    assert with_sinks == with_lse


@pytest.mark.parametrize("bad,match", [
    (torch.zeros(3), r"sinks: expected shape \(H,\) = \(4,\)"),
    (torch.zeros(4, dtype=torch.int64), "sinks: expected a float tensor"),
    ([0.0] * 4, "sinks: expected a float tensor"),
    (torch.tensor([0.0, float("inf"), 0.0, 0.0]), r"sinks: expected finite values, got \[0.0, "
                                                   r"inf, 0.0, 0.0\]"),
    (torch.tensor([float("nan")] * 4), "sinks: expected finite"),
])
def test_bad_sinks_refused(bad, match):
    q, k, v, _ = _inputs(torch.float32)
    with pytest.raises(AttnlabError, match=match):
        attnlab.attention(q, k, v, enable_gqa=True, sinks=bad)
    with pytest.raises(AttnlabError, match=match):
        attention_with_weights(q, k, v, enable_gqa=True, sinks=bad)


@pytest.mark.slow  # ~6 s: FlexAttention's first call
def test_flex_forward_on_cpu():
    from attnlab.ops import flex

    if not flex.available():
        pytest.skip("no FlexAttention in this torch")
    xs = _inputs(torch.float32)
    want_out, want_lse, _, _ = _want(xs, MASKS["window"]())
    with torch.no_grad():
        out, lse, _ = _run("flex", xs, MASKS["window"](), grad=False)
    torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)
