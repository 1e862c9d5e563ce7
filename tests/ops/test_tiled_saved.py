"""The tiled loop's autograd Function saves what its backward reads with `save_for_backward`
(q, k, v, out, lse, SDPA's attn_mask, the ALiBi slopes), so saved-tensor hooks see it: pack
hooks move every saved tensor to a NumPy copy, the inputs are then overwritten with NaN, and
the backward (first and second order) still gives the clean gradients."""

from __future__ import annotations

import pytest
import torch

import attnlab

from helpers import numpy_saved_hooks


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 4, 29, 16, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(29, 29, generator=g, dtype=torch.float64)
    slopes = torch.tensor([0.5, 0.25, 0.1, 0.05], dtype=torch.float64)
    return [x.requires_grad_(True) for x in (q, k, v)], bias, slopes


def _loss(out, lse):
    return (out * out.cos()).sum() + lse.sum()


@pytest.mark.parametrize("create_graph", [False, True])
def test_hooks_see_every_tensor_the_backward_reads(create_graph):
    (q, k, v), bias, slopes = _inputs()
    kw = dict(attn_mask=bias, alibi_slopes=slopes, is_causal=True, backend="tiled",
              return_lse=True)
    want = torch.autograd.grad(_loss(*attnlab.attention(q, k, v, **kw)), (q, k, v))
    hooks, store = numpy_saved_hooks()
    with hooks:
        out, lse = attnlab.attention(q, k, v, **kw)
    with torch.no_grad():
        for x in (q, k, v, bias, slopes):
            x.fill_(float("nan"))  # anything read past the hooks shows
    got = torch.autograd.grad(_loss(out, lse), (q, k, v), create_graph=create_graph)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert len(store) >= 7  # q, k, v, out, lse, the mask, the slopes (and their views)
