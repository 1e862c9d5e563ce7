"""Backend "tiled" backward: float64 gradcheck on small shapes (both inner paths, every mask kind,
softcap, ALiBi, dropout), FlashAttention's 3× rule for fp32/bf16 gradients, and zero gradient for
fully masked rows."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.ops import tiled
from attnlab.ops.api import make_problem

from helpers import assert_close, max_err, qkv


def tiled_fn(fused, **kw):
    def f(q, k, v):
        p = make_problem(q, k, v, kw.get("attn_mask"), kw.get("dropout_p", 0.0), False, None,
                         q.shape[-3] != k.shape[-3], mask=kw.get("mask"),
                         softcap=kw.get("softcap"), alibi_slopes=kw.get("alibi_slopes"))
        if "seed" in kw:
            torch.manual_seed(kw["seed"])  # the same dropout draw on every call
        return tiled.forward(p, fused=fused)[0]
    return f


MASKS = {
    "none": None,
    "causal_br": masks.causal("bottom_right"),
    "window": masks.sliding_window(5),
    "padding": masks.padding(key_lengths=[9, 0], query_lengths=[3, 11]),
    "unsorted_doc": masks.document(torch.arange(11) % 3, torch.arange(13) % 3),
    "document": masks.document(torch.arange(11) // 4, torch.arange(13) // 5),
}


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("name", list(MASKS))
def test_gradcheck_float64(fused, name):
    q, k, v = qkv(2, 4, 2, 11, 13, 3, dtype=torch.float64, seed=len(name), requires_grad=True)
    f = tiled_fn(fused, mask=MASKS[name])
    assert torch.autograd.gradcheck(f, (q, k, v), atol=1e-6, fast_mode=True)


def test_gradcheck_softcap_alibi_float_mask():
    q, k, v = qkv(1, 2, 1, 9, 12, 5, dtype=torch.float64, seed=3, requires_grad=True)
    slopes = torch.tensor([0.5, 0.125], dtype=torch.float64)
    bias = torch.randn(9, 12, dtype=torch.float64).masked_fill(torch.eye(9, 12) > 0, -torch.inf)
    f = tiled_fn(False, softcap=2.0, alibi_slopes=slopes, attn_mask=bias, mask=masks.causal())
    assert torch.autograd.gradcheck(f, (q, k, v), atol=1e-6, fast_mode=True)
    out = f(q, k, v)
    want = attnlab.attention(q, k, v, attn_mask=bias, is_causal=True, softcap=2.0, enable_gqa=True,
                             alibi_slopes=slopes, backend="math")
    assert_close(out, want, atol=1e-12, what="softcap+alibi vs math")


def test_gradcheck_dropout_replays_the_same_mask():
    q, k, v = qkv(1, 2, 2, 10, 14, 4, dtype=torch.float64, seed=4, requires_grad=True)
    f = tiled_fn(False, dropout_p=0.3, seed=123, mask=masks.sliding_window(6))
    assert torch.autograd.gradcheck(f, (q, k, v), atol=1e-6, fast_mode=True)
    # dropout really drops: output differs from the no-dropout one
    with torch.no_grad():
        assert max_err(f(q, k, v), tiled_fn(False, mask=masks.sliding_window(6))(q, k, v)) > 1e-3


def test_dropout_is_unbiased():
    q, k, v = qkv(1, 1, 1, 4, 300, 8, seed=5)
    v = torch.ones_like(v)
    outs = [attnlab.attention(q, k, v, dropout_p=0.5, backend="tiled") for _ in range(30)]
    mean = torch.stack(outs).mean()
    assert abs(float(mean) - 1.0) < 0.05, f"E[dropout(P) @ 1] should be 1, got {float(mean)}"


def _grads(fn, q, k, v, g):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    return torch.autograd.grad(fn(q, k, v), (q, k, v), g.to(q.dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fused", [True, False])
def test_gradients_fa_rule(dtype, fused):
    mask = masks.sliding_window(70) | masks.document(torch.arange(150) // 50)
    q, k, v = qkv(1, 4, 2, 150, 150, 32, dtype=dtype, seed=6)
    g = torch.randn(1, 4, 150, 32, generator=torch.Generator().manual_seed(0))
    ref = _grads(lambda *x: attnlab.attention(*x, mask=mask, enable_gqa=True, backend="math"),
                 q.double(), k.double(), v.double(), g.double())
    plain = _grads(lambda *x: attnlab.attention(*x, mask=mask, enable_gqa=True, backend="math"),
                   q, k, v, g)
    got = _grads(tiled_fn(fused, mask=mask), q, k, v, g)
    for name, a, p, r in zip("qkv", got, plain, ref):
        e, e_plain = max_err(a, r), max_err(p, r)
        assert e <= 3 * e_plain + 1e-6, f"d{name}: error {e:.3e} > 3x plain {e_plain:.3e}"


@pytest.mark.parametrize("fused", [True, False])
def test_fully_masked_rows_get_zero_gradient_not_nan(fused):
    q, k, v = qkv(1, 2, 2, 9, 9, 8, seed=7, requires_grad=True)
    mask = masks.padding(query_lengths=[4]) & masks.causal()
    out = tiled_fn(fused, mask=mask)(q, k, v)
    gq, gk, gv = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(t).all() for t in (gq, gk, gv))
    assert bool((gq[:, :, 4:] == 0).all())
