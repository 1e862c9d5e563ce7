"""Empty heads and batches: empty in, empty out (output and lse of the right shapes), on every
backend, for `attention` and `attention_weights`, and the backward runs."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks

from helpers import backend_names

BACKENDS = backend_names()
SHAPES = [  # (B, H, Hkv, L, S)
    (2, 0, 0, 5, 6),
    (0, 3, 3, 5, 6),
    (0, 0, 0, 5, 6),
    (0, 4, 2, 5, 6),
    (2, 0, 0, 0, 6),
    (0, 2, 2, 5, 0),
]
MASKS = {"none": {}, "causal": {"is_causal": True}, "window": {"mask": masks.sliding_window(2)},
         "bool": {"attn_mask": torch.ones(5, 6, dtype=torch.bool)}}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch_or_heads(backend, shape, mask):
    B, H, Hkv, L, S = shape
    kw = dict(MASKS[mask])
    if "attn_mask" in kw:
        kw["attn_mask"] = torch.ones(L, S, dtype=torch.bool)
    grad = backend != "reference"
    q = torch.randn(B, H, L, 8, requires_grad=grad)
    k = torch.randn(B, Hkv, S, 8, requires_grad=grad)
    v = torch.randn(B, Hkv, S, 4, requires_grad=grad)
    gqa = Hkv != H
    out, lse = attnlab.attention(q, k, v, backend=backend, return_lse=True, enable_gqa=gqa, **kw)
    assert out.shape == (B, H, L, 4) and lse.shape == (B, H, L)
    assert out.dtype == q.dtype
    if grad:
        gq, gk, gv = torch.autograd.grad(out.sum(), (q, k, v), allow_unused=True)
        for g, x in ((gq, q), (gk, k), (gv, v)):
            assert g is None or (g.shape == x.shape and not g.isnan().any())
    w = attnlab.attention_weights(q.detach(), k.detach(), lse.detach(), enable_gqa=gqa, **kw)
    assert w.shape == (B, H, L, S)


def test_heads_zero_is_like_sdpa():
    """SDPA's empty (B, 0, L, Dv) output, on every backend; torch 2.11's own CPU SDPA dies of a
    SIGFPE on zero heads (2.13 returns the empty output), so SDPA is asked only from 2.13."""
    q, k, v = torch.randn(3, 2, 0, 5, 8).unbind(0)
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 13):
        assert torch.nn.functional.scaled_dot_product_attention(q, k, v).shape == (2, 0, 5, 8)
    for backend in BACKENDS:
        got = attnlab.attention(q, k, v, backend=backend)
        assert got.shape == (2, 0, 5, 8)
