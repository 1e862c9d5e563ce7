"""One score pipeline: the math backend, the tiled kernel's pure-PyTorch chunks and
attention_weights compute their scores alike (scale after the product, then softcap, ALiBi, bias,
mask), checked bit for bit against each other and against the float64 oracle."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.ops import scores, tiled
from attnlab.ops.api import make_problem

from helpers import assert_close, oracle, qkv

# one row block and one chunk of the tiled kernel, so both paths run matmuls of the same shapes
SIZES = [(48, 64, 64), (48, 50, 200), (59, 128, 300)]  # D (scale not a power of 2), L, S


def tiled_pure(q, k, v, **kw):
    p = make_problem(q, k, v, kw.pop("attn_mask", None), 0.0, False, kw.pop("scale", None),
                     q.shape[-3] != k.shape[-3], mask=kw.pop("mask", None), **kw)
    return tiled.forward(p, fused=False)


@pytest.mark.parametrize("D, L, S", SIZES)
@pytest.mark.parametrize("scale", [None, 0.3])
def test_tiled_and_math_round_the_scale_alike(D, L, S, scale):
    q, k, v = qkv(2, 3, 3, L, S, D, seed=D + L)
    q = q * 3  # large scores: where the scale is applied shows in the last bits
    window = masks.sliding_window(S // 2, align="bottom_right")
    _, lse_tiled = tiled_pure(q, k, v, mask=window, scale=scale)
    _, lse_math = attnlab.attention(q, k, v, mask=window, scale=scale, backend="math",
                                    return_lse=True)
    assert torch.equal(lse_tiled, lse_math), (lse_tiled - lse_math).abs().max()
    w_tiled = attnlab.attention_weights(q, k, lse_tiled, mask=window, scale=scale)
    w_math = attnlab.attention_weights(q, k, lse_math, mask=window, scale=scale)
    assert torch.equal(w_tiled, w_math)
    _, lse_ref = oracle(q, k, v, allowed=window.to_dense(L, S)[0, 0], scale=scale)
    assert_close(lse_math, lse_ref, atol=1e-5, what="lse vs float64 oracle")


@pytest.mark.parametrize("D, L, S", SIZES[:2])
def test_modifiers_agree_bit_for_bit(D, L, S):
    q, k, v = qkv(1, 4, 2, L, S, D, seed=7)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    bias = torch.randn(L, S, generator=torch.Generator().manual_seed(1))
    kw = dict(mask=masks.causal("bottom_right"), attn_mask=bias, softcap=5.0, alibi_slopes=slopes,
              scale=0.3)
    _, lse_tiled = tiled_pure(q, k, v, **dict(kw))
    _, lse_math = attnlab.attention(q, k, v, enable_gqa=True, backend="math", return_lse=True,
                                    **kw)
    assert torch.equal(lse_tiled, lse_math), (lse_tiled - lse_math).abs().max()
    rows = [0, L // 2, L - 1]
    w = attnlab.attention_weights(q, k, lse_math, rows=rows, enable_gqa=True, **kw)
    assert_close(w.sum(-1), torch.ones(1, 4, 3), atol=1e-5, what="rows sum to 1")


def test_modify_applies_the_order():
    s = torch.tensor([[[[4.0, -1.0, 2.0]]]])  # (1, 1, R=1, C=3), already scaled
    slopes = torch.tensor([0.5])[:, None, None]  # (H, 1, 1)
    bias = torch.tensor([0.0, 1.0, -2.0])
    allowed = torch.tensor([True, True, False])
    got, t = scores.modify(s.clone(), softcap=3.0, slopes=slopes, rows=torch.tensor([1]),
                           cols=torch.arange(3), bias=bias, allowed=allowed)
    capped = 3.0 * torch.tanh(s / 3.0)
    want = capped + 0.5 * (torch.arange(3.0) - 1) + bias
    want = want.masked_fill(~allowed, float("-inf"))
    assert torch.equal(got, want)
    assert torch.equal(t, torch.tanh(s / 3.0))


def test_rows_with_nothing_to_attend():
    s = torch.full((2, 3), float("-inf"))
    s[0] = torch.tensor([1.0, 2.0, float("-inf")])
    w, lse = scores.softmax(s)
    assert torch.equal(w[1], torch.zeros(3)) and lse[1] == float("-inf")
    assert torch.equal(scores.exp_shift(torch.tensor([float("-inf"), 2.0])), torch.tensor([0., 2.]))
    assert torch.equal(torch.exp(s - scores.lse_for_exp(lse)[:, None])[1], torch.zeros(3))
