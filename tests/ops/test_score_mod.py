"""attention(score_mod=fn): FlexAttention's score_mod convention, forward and backward on CPU,
against the obvious float64 implementation (scores, fn on every pair, mask, softmax)."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks

TABLE = torch.linspace(-1.0, 1.0, 64, dtype=torch.float64)  # a relative-position bias table
HEAD_SCALE = torch.tensor([0.5, -0.25, 1.0, 2.0], dtype=torch.float64)
BATCH_SHIFT = torch.tensor([0.0, 0.7], dtype=torch.float64)


def rel_bias(s, b, h, q, k):
    return s + 0.1 * (k - q)


def tanh_cap(s, b, h, q, k):
    return 3.0 * torch.tanh(s / 3.0)  # non-linear: the backward needs fn's Jacobian


def bucketed(s, b, h, q, k):
    return s + TABLE[(q - k).clamp(-32, 31) + 32] * HEAD_SCALE[h]


def per_batch(s, b, h, q, k):
    return s * (1.0 + BATCH_SHIFT[b]) - 0.05 * (q - k).abs()


def masking(s, b, h, q, k):  # a score_mod may mask too: -inf, as in FlexAttention
    return torch.where((q + k) % 3 == 0, float("-inf"), s)


MODS = {"rel_bias": rel_bias, "tanh_cap": tanh_cap, "bucketed": bucketed,
        "per_batch": per_batch, "masking": masking}


def dense_ref(q, k, v, fn, allowed=None, scale=None):
    """float64: s = fn(q·kᵀ·scale, b, h, i, j) pair by pair (broadcast), mask, softmax, borrow."""
    q, k, v = q.double(), k.double(), v.double()
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    B, H, L, S = s.shape
    s = fn(s, torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None],
           torch.arange(L)[None, None, :, None], torch.arange(S)[None, None, None, :])
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    w = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return w @ v, lse


def inputs(L, S, H=4, Hkv=4, D=8, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, L, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, Hkv, S, D, generator=g, dtype=torch.float64) for _ in range(2))
    if grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v


MASKS = {
    "none": lambda: None,
    "causal_br": lambda: masks.causal("bottom_right"),
    "window": lambda: masks.window(4, 2, "bottom_right"),
    "function": lambda: masks.from_function(lambda b, h, q, k: (q - k) % 5 != 1),
}


@pytest.mark.parametrize("name", list(MODS))
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("L,S", [(37, 37), (13, 41), (41, 13)])
def test_forward_on_every_cpu_path(name, mask, L, S):
    fn, m = MODS[name], MASKS[mask]()
    q, k, v = inputs(L, S)
    allowed = None if m is None else m.to_dense(L, S)
    want, want_lse = dense_ref(q, k, v, fn, allowed)
    for backend in ("math", "tiled", "reference", "sdpa", "auto"):
        out, lse = attnlab.attention(q, k, v, mask=m, score_mod=fn, backend=backend,
                                     return_lse=True)
        assert (out - want).abs().max() < 1e-12, backend
        assert torch.equal(lse.isinf(), want_lse.isinf()), backend
        fin = want_lse.isfinite()
        assert (lse[fin] - want_lse[fin]).abs().max() < 1e-12, backend


@pytest.mark.parametrize("name", list(MODS))
@pytest.mark.parametrize("L,S,H,Hkv", [(37, 37, 4, 4), (29, 43, 4, 2), (43, 17, 4, 1)])
def test_backward_on_the_tiled_kernel(name, L, S, H, Hkv):
    fn = MODS[name]
    m = masks.window(6, 3, "bottom_right")
    q, k, v = inputs(L, S, H, Hkv, seed=1, grad=True)
    want, want_lse = dense_ref(q, k, v, fn, m.to_dense(L, S))
    w = torch.randn_like(want)
    wl = torch.randn_like(want_lse).masked_fill(want_lse.isinf(), 0)
    loss = (want * w).sum() + (torch.nan_to_num(want_lse, neginf=0.0) * wl).sum()
    grads_want = torch.autograd.grad(loss, (q, k, v))
    for backend in ("tiled", "math"):
        out, lse = attnlab.attention(q, k, v, mask=m, score_mod=fn, backend=backend,
                                     return_lse=True, enable_gqa=Hkv != H)
        loss = (out * w).sum() + (torch.nan_to_num(lse, neginf=0.0) * wl).sum()
        for got, ref, what in zip(torch.autograd.grad(loss, (q, k, v)), grads_want, "qkv"):
            assert (got - ref).abs().max() < 1e-10, f"{backend} d{what}"


def test_math_gives_gradients_into_captured_tensors():
    table = torch.zeros(9, dtype=torch.float64, requires_grad=True)

    def learned(s, b, h, q, k):
        return s + table[(q - k).clamp(-4, 4) + 4]

    q, k, v = inputs(11, 11)
    out = attnlab.attention(q, k, v, score_mod=learned, backend="math")
    (g,) = torch.autograd.grad(out.sum(), table)
    eps = 1e-6
    bumped = table.detach().clone()
    bumped[3] += eps

    def shifted(s, b, h, q_, k_):
        return s + bumped[(q_ - k_).clamp(-4, 4) + 4]

    numeric = (attnlab.attention(q, k, v, score_mod=shifted, backend="math").sum()
               - out.sum()) / eps
    assert abs(float(g[3].detach()) - float(numeric.detach())) < 1e-4


def test_select_backend_says_where_and_why():
    q, k, v = inputs(16, 16)
    c = attnlab.select_backend(q, k, v, score_mod=rel_bias)
    assert c.backend == "tiled" and "score_mod" in c.reason
    c = attnlab.select_backend(q, k, v, score_mod=rel_bias, mask=masks.causal())
    assert c.backend == "tiled"


def test_fused_paths_skip_a_score_mod():
    from attnlab.ops import fused_cpu
    from attnlab.ops.validate import make_problem
    q, k, v = (t.float() for t in inputs(16, 16))
    p = make_problem(q, k, v, None, 0.0, False, None, False, mask=None, score_mod=rel_bias)
    assert not fused_cpu.applies(p)


def test_weights_on_demand_with_a_score_mod():
    q, k, v = inputs(23, 31)
    m = masks.causal("bottom_right")
    want, _ = dense_ref(q, k, v, bucketed, m.to_dense(23, 31))
    out, w = attnlab.ops.attention_with_weights(q, k, v, mask=m, score_mod=bucketed,
                                                rows=[0, 7, 22])
    assert (out - want).abs().max() < 1e-12
    s = (q @ k.transpose(-1, -2)) * 8 ** -0.5
    b, h = torch.arange(2)[:, None, None, None], torch.arange(4)[None, :, None, None]
    i, j = torch.arange(23)[None, None, :, None], torch.arange(31)[None, None, None, :]
    s = bucketed(s, b, h, i, j).masked_fill(~m.to_dense(23, 31), float("-inf"))
    assert (w - torch.softmax(s, -1)[:, :, [0, 7, 22]]).abs().max() < 1e-12


def test_alibi_modifier_through_score_mod():
    slopes = torch.tensor([[0.5, 0.25, 0.125, 0.0625], [1.0, 0.5, 0.25, 0.125]],
                          dtype=torch.float64)
    q, k, v = inputs(9, 14)
    mod = masks.alibi(slopes, symmetric=True, align="bottom_right")
    want, _ = dense_ref(q, k, v, lambda s, b, h, i, j: s - slopes[b, h] * (i + 5 - j).abs())
    for backend in ("math", "tiled", "reference"):
        out = attnlab.attention(q, k, v, score_mod=mod, backend=backend)
        assert (out - want).abs().max() < 1e-12, backend


@pytest.mark.parametrize("fn,match", [
    (3, "callable"),
    (lambda s, b, h, q, k: s > 0, "float"),
    (lambda s, b, h, q, k: torch.zeros(5, 5, 5, 5, 5, dtype=s.dtype), "shape"),
])
def test_bad_score_mods(fn, match):
    q, k, v = inputs(6, 6)
    with pytest.raises(AttnlabError, match=match):
        attnlab.attention(q, k, v, score_mod=fn, backend="math")
