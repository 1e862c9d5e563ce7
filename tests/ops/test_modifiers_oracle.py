"""Softcap and ALiBi against an independent float64 formula, on every backend and in the weights:
scores = softcap · tanh(q·k·scale / softcap) + slope_h · (j - i), then the masks, then softmax."""

from __future__ import annotations

import math

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks

from helpers import assert_close, qkv

BACKENDS = ["auto", "sdpa", "math", "tiled"]


def formula(q, k, v, slopes=None, softcap=None, allowed=None, scale=None):
    """(out, lse, weights) in float64, written from the definitions; GQA by repeat."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(g, -3), v.repeat_interleave(g, -3)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    L, S = s.shape[-2:]
    if slopes is not None:
        for h in range(s.shape[1]):
            for i in range(L):
                s[:, h, i] += float(slopes[h]) * (torch.arange(S, dtype=torch.float64) - i)
    if allowed is not None:
        s = s.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s, -1)
    w = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0)[..., None])
    w = torch.where(torch.isfinite(lse)[..., None], w, 0)
    return w @ v, lse, w


SLOPES = torch.tensor([0.5, 0.25, 0.125, 2 ** -0.5])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["alibi", "softcap", "both", "both_causal"])
@pytest.mark.parametrize("L,S", [(7, 7), (5, 9), (150, 140)])
def test_modifiers_match_the_formula(backend, case, L, S):
    q, k, v = qkv(2, 4, 2, L, S, 8, seed=L + S)
    q = q * 3  # large scores, so softcap bites
    slopes = SLOPES if case != "softcap" else None
    cap = 1.5 if case != "alibi" else None
    causal = case == "both_causal"
    allowed = masks.causal().to_dense(L, S)[0, 0] if causal else None
    out, lse = attnlab.attention(q, k, v, enable_gqa=True, is_causal=causal, backend=backend,
                                 alibi_slopes=slopes, softcap=cap, return_lse=True)
    want, want_lse, want_w = formula(q, k, v, slopes, cap, allowed)
    assert_close(out, want, atol=2e-5, rtol=1e-5, what=f"{backend} output")
    assert_close(lse, want_lse, atol=2e-5, rtol=1e-5, what=f"{backend} lse")
    w = attnlab.attention_weights(q, k, lse, enable_gqa=True, is_causal=causal,
                                  alibi_slopes=slopes, softcap=cap)
    assert_close(w, want_w, atol=2e-5, what="attention_weights")


@pytest.mark.parametrize("backend", ["math", "tiled"])
def test_alibi_float64_with_padding_and_gradients(backend):
    q, k, v = qkv(2, 4, 4, 6, 6, 5, dtype=torch.float64, requires_grad=True)
    mask = masks.padding(key_lengths=[6, 4])
    out = attnlab.attention(q, k, v, mask=mask, alibi_slopes=SLOPES.double(), softcap=2.0,
                            backend=backend)
    want, _, _ = formula(q, k, v, SLOPES, 2.0, mask.to_dense(6, 6))
    assert_close(out, want, atol=1e-12, what="float64 output")
    got = torch.autograd.grad(out.square().sum(), (q, k, v))
    exp = torch.autograd.grad(want.square().sum(), (q, k, v))
    for g, e in zip(got, exp):
        assert_close(g, e, atol=1e-10, what="float64 gradient")


def test_alibi_penalises_distance():
    """A positive slope makes far keys lose: with equal raw scores, weight falls with i - j."""
    q, k = torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2)
    v = torch.eye(4)[None, None]  # output row = the weights themselves
    out = attnlab.attention(q, k, v, is_causal=True, alibi_slopes=torch.tensor([1.0]),
                            backend="math")
    row = out[0, 0, 3]  # the last query sees keys 0..3 with biases -3, -2, -1, 0
    assert_close(row, torch.softmax(torch.tensor([-3.0, -2.0, -1.0, 0.0]), -1), atol=1e-6)


def test_reference_backend_refuses_modifiers():
    q, k, v = qkv(1, 2, 2, 3, 3, 4)
    with pytest.raises(AttnlabError, match="softcap"):
        attnlab.attention(q, k, v, backend="reference", softcap=1.0)
