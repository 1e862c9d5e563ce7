"""The returned lse is differentiable on every backend that computes gradients, exactly: with
lse_i = log Σ_j exp(s_ij), d lse_i / d s_ij = softmax weight P_ij. Checked against float64 autograd
of the definition written out below for every mask kind, GQA, softcap and rows with nothing to
attend (lse −inf: zero gradient, never NaN); gradcheck on small cases; fp32/bf16 under the
FlashAttention rule; and `ops.tiled.backward`, the backward from a given global out and lse."""

from __future__ import annotations

import math

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.ops import tiled
from attnlab.ops.api import attention_with_weights, make_problem

from helpers import SLACK, qkv

B, H, L, S, D = 2, 4, 19, 23, 8
NEG = float("-inf")


def definition(q, k, v, *, allowed=None, bias=None, softcap=None, scale=None):
    """(out, lse) of attention as written in textbooks, float64 autograd; a row with nothing to
    attend: out 0, lse -inf, no gradient (its scores are masked constants)."""
    G = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(G, -3), v.repeat_interleave(G, -3)
    s = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = s.masked_fill(~allowed, NEG)
    alive = (s > NEG).any(-1, keepdim=True)  # (..., L, 1)
    s = torch.where(alive, s, 0.0)  # dead rows: any finite row, result replaced below
    lse = torch.logsumexp(s, -1, keepdim=True)
    w = torch.where(alive, torch.exp(s - lse), 0.0)
    return w @ v, torch.where(alive, lse, NEG).squeeze(-1)


def _mask_cases():
    bias = torch.randn(L, S, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    bias[3] = NEG  # a row the float mask leaves empty
    bias[:, 7] = NEG
    dense = torch.rand(B, 1, L, S, generator=torch.Generator().manual_seed(6)) > 0.5
    dense[1, :, 4] = False
    return {  # name: (attention kwargs, allowed or None, bias or None)
        "none": ({}, None, None),
        "causal": ({"is_causal": True}, masks.causal().to_dense(L, S), None),
        "sliding": ({"mask": masks.sliding_window(5)}, masks.sliding_window(5).to_dense(L, S),
                    None),
        "document": ({"mask": masks.document(torch.arange(L) // 6, torch.arange(S) // 7)},
                     masks.document(torch.arange(L) // 6, torch.arange(S) // 7).to_dense(L, S),
                     None),
        "padding_empty_rows": (
            {"mask": masks.padding(key_lengths=[S - 4, 0], query_lengths=[L - 6, L])},
            masks.padding(key_lengths=[S - 4, 0], query_lengths=[L - 6, L]).to_dense(L, S),
            None),
        "prefix_lm": ({"mask": masks.prefix_lm(6)}, masks.prefix_lm(6).to_dense(L, S), None),
        "combo": ({"mask": (masks.sliding_window(3) | masks.prefix_lm(2))
                   & masks.padding(key_lengths=S - 5)},
                  ((masks.sliding_window(3) | masks.prefix_lm(2))
                   & masks.padding(key_lengths=S - 5)).to_dense(L, S), None),
        "dense_bool": ({"attn_mask": dense}, dense, None),
        "float_bias": ({"attn_mask": bias}, None, bias),
    }


MASKS = _mask_cases()
BACKENDS = ["tiled", "sdpa", "auto"]


def _grads(fn, q, k, v, w, u):
    out, lse = fn(q, k, v)
    return (out, lse, *torch.autograd.grad([out, lse], (q, k, v), [w, u]))


def _inputs(Hkv, seed, dtype=torch.float64):
    q, k, v = qkv(B, H, Hkv, L, S, D, dtype=dtype, seed=seed, requires_grad=True)
    g = torch.Generator().manual_seed(seed + 100)
    w = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)  # d loss / d out
    u = torch.randn(B, H, L, generator=g, dtype=torch.float64)  # d loss / d lse, dead rows too
    return q, k, v, w, u


def _check_exact(got, want, what):
    names = ("out", "lse", "dq", "dk", "dv")
    for name, a, b in zip(names, got, want):
        a, b = a.detach(), b.detach()
        assert not a.isnan().any(), f"{what}: NaN in {name}"
        fin = torch.isfinite(b)
        assert torch.equal(torch.isfinite(a), fin), f"{what}: -inf rows of {name} differ"
        scale = max(float(b[fin].abs().max()) if fin.any() else 1.0, 1.0)
        err = float((a[fin] - b[fin]).abs().max()) if fin.any() else 0.0
        assert err <= 1e-10 * scale, f"{what}: {name} off by {err:.3e}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("Hkv", [H, 2, 1], ids=["mha", "gqa", "mqa"])
def test_lse_gradient_equals_the_definition(backend, mask, Hkv):
    kw, allowed, bias = MASKS[mask]
    q, k, v, w, u = _inputs(Hkv, seed=len(mask) + Hkv)
    got = _grads(lambda *x: attnlab.attention(*x, return_lse=True, backend=backend,
                                              enable_gqa=Hkv != H, **kw), q, k, v, w, u)
    want = _grads(lambda *x: definition(*x, allowed=allowed, bias=bias), q, k, v, w, u)
    _check_exact(got, want, f"{backend} {mask} Hkv={Hkv}")


@pytest.mark.parametrize("backend", ["tiled", "auto"])  # "sdpa" computes softcap on math
@pytest.mark.parametrize("mask", ["none", "causal", "padding_empty_rows", "float_bias"])
def test_lse_gradient_with_softcap(backend, mask):
    kw, allowed, bias = MASKS[mask]
    q, k, v, w, u = _inputs(2, seed=11)
    got = _grads(lambda *x: attnlab.attention(*x, return_lse=True, backend=backend, softcap=2.5,
                                              enable_gqa=True, **kw), q, k, v, w, u)
    want = _grads(lambda *x: definition(*x, allowed=allowed, bias=bias, softcap=2.5),
                  q, k, v, w, u)
    _check_exact(got, want, f"{backend} softcap {mask}")


@pytest.mark.parametrize("backend,how", [*((b, h) for b in BACKENDS
                                             for h in ("structured", "float_bias")),
                                          ("math", "float_bias")])
def test_rows_with_nothing_to_attend_get_zero_gradient(backend, how):
    """d lse of a row whose lse is -inf (here: 1 on every row) moves nothing and makes no NaN."""
    q, k, v, _, _ = _inputs(2, seed=3)
    if how == "structured":
        kw = {"mask": masks.padding(key_lengths=[S, 0], query_lengths=[5, L])}
        dead = (slice(0, 1), slice(None), slice(5, None))  # batch 0 rows >= 5; batch 1: all
    else:
        bias = torch.zeros(L, S, dtype=torch.float64)
        bias[2] = NEG
        kw, dead = {"attn_mask": bias}, (slice(None), slice(None), slice(2, 3))
    out, lse = attnlab.attention(q, k, v, return_lse=True, backend=backend, enable_gqa=True,
                                 **kw)
    assert (lse[dead] == -math.inf).all()
    gq, gk, gv = torch.autograd.grad([out, lse], (q, k, v),
                                     [torch.ones_like(out), torch.ones_like(lse)])
    for g in (gq, gk, gv):
        assert torch.isfinite(g).all()
    assert (gq[dead] == 0).all()
    if how == "structured":
        assert (gk[1] == 0).all() and (gv[1] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_lse_alone_has_a_gradient(backend):
    """Only the lse in the loss: dout is absent, d lse / d q = scale · Σ_j P_ij k_j."""
    q, k, v = qkv(1, 2, 2, 7, 9, 4, dtype=torch.float64, seed=2, requires_grad=True)
    _, lse = attnlab.attention(q, k, v, is_causal=True, return_lse=True, backend=backend)
    gq, gk, gv = torch.autograd.grad(lse.sum(), (q, k, v))
    p = torch.softmax((q @ k.transpose(-2, -1) / 2).masked_fill(
        ~masks.causal().to_dense(7, 9), NEG), -1)
    torch.testing.assert_close(gq, p @ k / 2, rtol=0, atol=1e-12)
    assert (gv == 0).all()
    assert gk.abs().sum() > 0


@pytest.mark.parametrize("backend,softcap", [("tiled", None), ("sdpa", None), ("tiled", 1.5)])
def test_gradcheck_out_and_lse(backend, softcap):
    q, k, v = qkv(1, 2, 1, 5, 6, 3, dtype=torch.float64, seed=9, requires_grad=True)

    def f(q, k, v):  # one output, so a lse without gradient cannot go unchecked
        out, lse = attnlab.attention(q, k, v, mask=masks.sliding_window(3), enable_gqa=True,
                                     softcap=softcap, return_lse=True, backend=backend)
        return torch.cat([out.flatten(), lse.flatten()])

    assert torch.autograd.gradcheck(f, (q, k, v), atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_low_precision_lse_gradient_flash_attention_rule(dtype, backend):
    """Gradients with dlse ≠ 0 within 3× a plain same-dtype implementation's error (float64
    definition as the oracle); fp16/bf16 carry -dlse in two columns (high + low part)."""
    q, k, v, w, u = _inputs(2, seed=21)
    kw, allowed, _ = MASKS["sliding"]
    want = _grads(lambda *x: definition(*x, allowed=allowed), q, k, v, w, u)
    low = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    got = _grads(lambda *x: attnlab.attention(*x, return_lse=True, backend=backend,
                                              enable_gqa=True, **kw), *low,
                 w.to(dtype), u.float())
    plain_low = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    plain = _grads(lambda *x: definition(*x, allowed=allowed), *plain_low, w.to(dtype),
                   u.to(dtype))
    for name, a, p, ref in zip(("dq", "dk", "dv"), got[2:], plain[2:], want[2:]):
        e = float((a.double() - ref).abs().max())
        e_plain = float((p.double() - ref).abs().max())
        assert e <= 3 * e_plain + SLACK[dtype], f"{name}: {e:.3e} > 3 x plain {e_plain:.3e}"


def test_sdpa_with_a_float_mask_that_needs_a_gradient_runs_on_math():
    """The fused kernel has no mask gradient: with return_lse the call takes the math path."""
    q, k, v, w, u = _inputs(2, seed=4)
    bias = MASKS["float_bias"][2].clone().requires_grad_()
    out, lse = attnlab.attention(q, k, v, attn_mask=bias, return_lse=True, backend="sdpa",
                                 enable_gqa=True)
    got = torch.autograd.grad([out, lse], (q, bias), [w, u])
    want = torch.autograd.grad(definition(q, k, v, bias=bias), (q, bias), [w, u])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_from_the_lse_carry_the_right_gradient(backend):
    """attention_with_weights: w = exp(s − lse), so w's gradient needs the lse's."""
    q, k, v, _, _ = _inputs(2, seed=8)
    kw, allowed, _ = MASKS["sliding"]
    _, wts = attention_with_weights(q, k, v, backend=backend, enable_gqa=True, **kw)
    c = torch.randn(wts.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = torch.autograd.grad((wts * c).sum(), (q, k))
    s = (q @ k.repeat_interleave(2, 1).transpose(-2, -1)) * D ** -0.5
    ref = torch.softmax(s.masked_fill(~allowed, NEG), -1)
    want = torch.autograd.grad((ref * c).sum(), (q, k))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def _split_case(Hkv, softcap, masked):
    q, k, v, w, u = _inputs(Hkv, seed=31 + Hkv)
    allowed = MASKS["padding_empty_rows"][1] if masked else None
    out, lse = definition(q, k, v, allowed=allowed, softcap=softcap)
    want = torch.autograd.grad([out, lse], (q, k, v), [w, u])
    return q, k, v, w, u, allowed, out.detach(), lse.detach(), want


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("Hkv,softcap,masked", [(H, None, False), (2, None, True),
                                                (1, None, True), (2, 3.0, True)])
def test_backward_from_the_global_out_and_lse_gives_each_key_block_its_share(
        fused, Hkv, softcap, masked):
    """`tiled.backward` on two key blocks, each given the rows' global out and lse: the blocks'
    dk, dv are the whole call's, their dq add up to the whole dq."""
    q, k, v, w, u, allowed, out, lse, (dq, dk, dv) = _split_case(Hkv, softcap, masked)
    cut = 9
    total = torch.zeros_like(dq)
    for cols in (slice(0, cut), slice(cut, S)):
        kb, vb = k.detach()[:, :, cols], v.detach()[:, :, cols]
        am = None if allowed is None else allowed[..., cols]
        p = make_problem(q.detach(), kb, vb, am, 0.0, False, None, Hkv != H, mask=None,
                         softcap=softcap)
        gq, gk, gv = tiled.backward(p, out, lse, w, u, fused=fused and softcap is None)
        torch.testing.assert_close(gk, dk[:, :, cols], rtol=0, atol=1e-12)
        torch.testing.assert_close(gv, dv[:, :, cols], rtol=0, atol=1e-12)
        total += gq
    torch.testing.assert_close(total, dq, rtol=0, atol=1e-12)
