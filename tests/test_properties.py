"""Properties that hold for any input, on every backend: the output is the float64 oracle's under
any mask (structured, dense, combined) with MHA/GQA/MQA; weights are distributions; keys/values
can be permuted together; causal outputs ignore the future. Lengths reach a few hundred, so the
tiled backend walks several tiles and chunks."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnlab
from attnlab import masks

from helpers import assert_close, oracle

BACKENDS = ["auto", "sdpa", "math", "tiled", "reference"]
backends = st.sampled_from(BACKENDS)
# mostly short (cheap, many corner cases), sometimes past the 128-row / 64-column tiles
lengths = st.one_of(st.integers(1, 12), st.integers(1, 12), st.integers(100, 300))
dims = st.tuples(lengths, lengths, st.integers(1, 12))  # L, S, D
heads = st.sampled_from([(1, 1), (2, 2), (4, 2), (4, 1), (3, 3)])  # (H, Hkv): MHA, GQA, MQA
MASK_KINDS = ["none", "causal", "causal_br", "window", "padding", "document", "prefix",
              "dense", "dense_per_head", "window|prefix", "~document&causal_br"]
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _inputs(seed, B, H, Hkv, L, S, D):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, D, generator=g), torch.randn(B, Hkv, S, D, generator=g),
            torch.randn(B, Hkv, S, D, generator=g))


def _mask(kind, B, H, L, S, rnd):
    """(kwargs for attention, dense bool (B|1, H|1, L, S) or None)."""
    g = torch.Generator().manual_seed(rnd.randint(0, 2**31))
    seg = lambda n: torch.sort(torch.randint(0, 3, (B, n), generator=g)).values  # noqa: E731
    m = {
        "none": None,
        "causal": masks.causal(),
        "causal_br": masks.causal("bottom_right"),
        "window": masks.sliding_window(rnd.randint(1, 40)),
        "padding": masks.padding(key_lengths=[rnd.randint(0, S) for _ in range(B)],
                                 query_lengths=[rnd.randint(0, L) for _ in range(B)]),
        "document": masks.document(seg(L), seg(S)),
        "prefix": masks.prefix_lm(rnd.randint(0, S)),
        "window|prefix": masks.sliding_window(rnd.randint(1, 9)) | masks.prefix_lm(2),
        "~document&causal_br": ~masks.document(seg(L), seg(S)) & masks.causal("bottom_right"),
    }.get(kind)
    if kind.startswith("dense"):
        t = torch.rand(B, H if kind == "dense_per_head" else 1, L, S, generator=g) > 0.4
        return {"attn_mask": t}, t
    if m is None:
        return {}, None
    return {"mask": m}, m.to_dense(L, S)


@SETTINGS
@given(dims, heads, st.sampled_from(MASK_KINDS), backends, st.integers(0, 10_000),
       st.randoms(use_true_random=False))
def test_every_backend_matches_the_oracle_under_any_mask(d, hk, kind, backend, seed, rnd):
    (L, S, D), (H, Hkv), B = d, hk, 2
    q, k, v = _inputs(seed, B, H, Hkv, L, S, D)
    kw, allowed = _mask(kind, B, H, L, S, rnd)
    out, lse = attnlab.attention(q, k, v, enable_gqa=Hkv != H, backend=backend, return_lse=True,
                                 **kw)
    ref, ref_lse = oracle(q, k, v, allowed=allowed)
    assert out.shape == (B, H, L, D) and lse.shape == (B, H, L)
    assert not out.isnan().any() and not lse.isnan().any()
    assert_close(out, ref, atol=2e-5, rtol=1e-5, what=f"{backend} output")
    dead = ~torch.isfinite(ref_lse)
    assert bool((lse[dead] == -math.inf).all()) and bool((out[dead] == 0).all())
    assert_close(lse[~dead], ref_lse[~dead], atol=2e-5, rtol=1e-5, what=f"{backend} lse")


@SETTINGS
@given(dims, heads, st.sampled_from(MASK_KINDS), st.integers(0, 10_000),
       st.randoms(use_true_random=False))
def test_weights_are_distributions(d, hk, kind, seed, rnd):
    (L, S, D), (H, Hkv), B = d, hk, 2
    q, k, _ = _inputs(seed, B, H, Hkv, L, S, D)
    kw, allowed = _mask(kind, B, H, L, S, rnd)
    gqa = Hkv != H
    _, lse = attnlab.attention(q, k, k, enable_gqa=gqa, return_lse=True, **kw)
    w = attnlab.attention_weights(q, k, lse, enable_gqa=gqa, **kw)
    live = torch.isfinite(lse)
    sums = w.double().sum(-1)
    assert_close(sums[live], torch.ones_like(sums[live]), atol=1e-5, what="row sums")
    assert bool((sums[~live] == 0).all()) and bool((w >= 0).all())
    if allowed is not None:
        assert bool((w.masked_fill(allowed, 0) == 0).all()), "weight on a masked pair"


@SETTINGS
@given(dims, heads, backends, st.randoms(use_true_random=False), st.integers(0, 10_000))
def test_permuting_keys_and_values_leaves_output_unchanged(d, hk, backend, rnd, seed):
    (L, S, D), (H, Hkv) = d, hk
    q, k, v = _inputs(seed, 1, H, Hkv, L, S, D)
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(1, 1, L, S, generator=g) > 0.3  # permuted with the keys
    perm = list(range(S))
    rnd.shuffle(perm)
    kw = dict(enable_gqa=Hkv != H, backend=backend)
    a = attnlab.attention(q, k, v, attn_mask=keep, **kw)
    b = attnlab.attention(q, k[:, :, perm], v[:, :, perm], attn_mask=keep[..., perm], **kw)
    assert_close(a, b, atol=1e-5, rtol=1e-5)


@SETTINGS
@given(lengths, st.integers(1, 8), heads, st.integers(0, 10_000), backends)
def test_causal_output_ignores_future_tokens(L, D, hk, seed, backend):
    (H, Hkv) = hk
    q, k, v = _inputs(seed, 1, H, Hkv, L, L, D)
    cut = L // 2
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, cut:] = torch.randn_like(x[:, :, cut:]) * 5
    kw = dict(is_causal=True, backend=backend, enable_gqa=Hkv != H)
    a = attnlab.attention(q, k, v, **kw)
    b = attnlab.attention(q2, k2, v2, **kw)
    assert_close(a[:, :, :cut], b[:, :, :cut], atol=1e-5, rtol=1e-5)


@SETTINGS
@given(dims, st.integers(0, 10_000), backends)
def test_query_permutation_equivariance(d, seed, backend):
    L, S, D = d
    q, k, v = _inputs(seed, 1, 2, 2, L, S, D)
    perm = torch.randperm(L, generator=torch.Generator().manual_seed(seed))
    a = attnlab.attention(q, k, v, backend=backend)[:, :, perm]
    b = attnlab.attention(q[:, :, perm], k, v, backend=backend)
    assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_trace_weights_are_distributions():
    t = attnlab.trace(*(x[0, 0] for x in _inputs(3, 1, 1, 1, 5, 7, 4)),
                      mask=masks.causal("bottom_right"), scale=0.7)
    live = t.mask.any(-1)
    assert np.allclose(t.weights.sum(-1)[live], 1.0) and (t.weights[~t.mask] == 0).all()
