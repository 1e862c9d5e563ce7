"""Properties that hold for any input: weights are distributions, keys/values can be permuted
together, causal outputs ignore the future."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlab
from attnlab import masks

from helpers import assert_close

dims = st.tuples(st.integers(1, 9), st.integers(1, 9), st.integers(1, 12))  # L, S, D
backends = st.sampled_from(["auto", "sdpa", "math"])


def _inputs(seed, L, S, D, H=2):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, H, L, D, generator=g), torch.randn(1, H, S, D, generator=g),
            torch.randn(1, H, S, D, generator=g))


@settings(max_examples=60, deadline=None)
@given(dims, st.integers(0, 10_000), st.floats(0.01, 3.0))
def test_weights_are_distributions(d, seed, scale):
    L, S, D = d
    q, k, v = _inputs(seed, L, S, D)
    t = attnlab.trace(q[0], k[0], v[0], mask=masks.causal("bottom_right"), scale=scale)
    sums = t.weights.sum(-1)
    live = t.mask.any(-1)
    assert np.allclose(sums[..., live], 1.0) and np.all(sums[..., ~live] == 0)
    assert (t.weights >= 0).all() and (t.weights[..., ~t.mask] == 0).all()


@settings(max_examples=40, deadline=None)
@given(dims, st.integers(0, 10_000), backends, st.randoms(use_true_random=False))
def test_permuting_keys_and_values_leaves_output_unchanged(d, seed, backend, rnd):
    L, S, D = d
    q, k, v = _inputs(seed, L, S, D)
    perm = list(range(S))
    rnd.shuffle(perm)
    a = attnlab.attention(q, k, v, backend=backend)
    b = attnlab.attention(q, k[:, :, perm], v[:, :, perm], backend=backend)
    assert_close(a, b, atol=1e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 12), st.integers(1, 8), st.integers(0, 10_000), backends)
def test_causal_output_ignores_future_tokens(L, D, seed, backend):
    q, k, v = _inputs(seed, L, L, D)
    cut = L // 2
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, cut:] = torch.randn_like(x[:, :, cut:]) * 5
    a = attnlab.attention(q, k, v, is_causal=True, backend=backend)
    b = attnlab.attention(q2, k2, v2, is_causal=True, backend=backend)
    assert_close(a[:, :, :cut], b[:, :, :cut], atol=1e-5, rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(dims, st.integers(0, 10_000))
def test_query_permutation_equivariance(d, seed):
    L, S, D = d
    q, k, v = _inputs(seed, L, S, D)
    perm = torch.randperm(L, generator=torch.Generator().manual_seed(seed))
    a = attnlab.attention(q, k, v)[:, :, perm]
    b = attnlab.attention(q[:, :, perm], k, v)
    assert_close(a, b, atol=1e-5, rtol=1e-5)
