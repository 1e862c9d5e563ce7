"""The decided semantics: empty rows give 0 / -inf / zero gradient and never NaN, poison in
never-attended keys and values never leaks, empty and length-1 sequences, dropout."""

from __future__ import annotations

import math

import pytest
import torch

import attnlab
from attnlab import masks

from helpers import assert_close, oracle, qkv

BACKENDS = ["auto", "sdpa", "math", "reference"]
GRAD_BACKENDS = ["auto", "sdpa", "math"]


def _fully_masked_row_inputs():
    q, k, v = qkv(2, 4, 2, 9, 11, 16, requires_grad=True)
    # batch 0: query rows >= 5 are padding; batch 1: no key at all
    mask = masks.padding(key_lengths=[11, 0], query_lengths=[5, 9])
    return q, k, v, mask


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_rows_give_zero_and_minus_inf(backend):
    q, k, v, mask = _fully_masked_row_inputs()
    with torch.no_grad():
        out, lse = attnlab.attention(q, k, v, mask=mask, enable_gqa=True, return_lse=True,
                                     backend=backend)
    assert not out.isnan().any() and not lse.isnan().any()
    assert (out[0, :, 5:] == 0).all() and (out[1] == 0).all()
    assert (lse[0, :, 5:] == -math.inf).all() and (lse[1] == -math.inf).all()
    assert torch.isfinite(lse[0, :, :5]).all()
    allowed = mask.to_dense(9, 11)
    ref, _ = oracle(q, k, v, allowed=allowed)
    assert_close(out, ref, atol=1e-5)


@pytest.mark.parametrize("backend", GRAD_BACKENDS)
def test_fully_masked_rows_have_zero_gradient(backend):
    q, k, v, mask = _fully_masked_row_inputs()
    out = attnlab.attention(q, k, v, mask=mask, enable_gqa=True, backend=backend)
    gq, gk, gv = torch.autograd.grad(out.sum(), (q, k, v))
    for g in (gq, gk, gv):
        assert not g.isnan().any()
    assert (gq[0, :, 5:] == 0).all() and (gq[1] == 0).all()
    assert (gk[1] == 0).all() and (gv[1] == 0).all()


@pytest.mark.parametrize("backend", GRAD_BACKENDS)
def test_fully_masked_rows_lse_gradient_is_finite(backend):
    q, k, v, mask = _fully_masked_row_inputs()
    out, lse = attnlab.attention(q, k, v, mask=mask, enable_gqa=True, backend=backend,
                                 return_lse=True)
    loss = out.sum() + torch.where(torch.isfinite(lse), lse, 0).sum()
    for g in torch.autograd.grad(loss, (q, k, v)):
        assert not g.isnan().any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("poison", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("how", ["padding", "bool", "float", "causal"])
def test_poison_in_masked_keys_and_values_never_leaks(backend, poison, how):
    L, S = 6, 10
    q, k, v = qkv(2, 2, 2, L, S, 8)
    k[:, :, 7:] = poison  # positions 7.. are masked out for every query below
    v[:, :, 7:] = poison
    kw = {
        "padding": {"mask": masks.padding(key_lengths=[7, 7])},
        "bool": {"attn_mask": torch.arange(S) < 7},
        "float": {"attn_mask": torch.where(torch.arange(S) < 7, 0.0, -math.inf)},
        "causal": {"is_causal": True},  # top-left: queries 0..5 see keys <= 5
    }[how]
    out, lse = attnlab.attention(q, k, v, backend=backend, return_lse=True, **kw)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    ref, _ = oracle(q[..., :7, :][..., :L, :], k[..., :7, :], v[..., :7, :],
                    allowed=(torch.arange(7)[None] <= torch.arange(L)[:, None])
                    if how == "causal" else None)
    assert_close(out, ref, atol=1e-5)


@pytest.mark.parametrize("backend", GRAD_BACKENDS)
def test_poison_gradients_stay_finite(backend):
    q, k, v = qkv(1, 2, 2, 5, 8, 8)
    k[:, :, 6:] = float("nan")
    v[:, :, 6:] = float("nan")
    for t in (q, k, v):
        t.requires_grad_(True)
    out = attnlab.attention(q, k, v, mask=masks.padding(key_lengths=[6]), backend=backend)
    gq, gk, gv = torch.autograd.grad(out.sum(), (q, k, v))
    assert torch.isfinite(gq).all() and torch.isfinite(gk).all() and torch.isfinite(gv).all()
    assert (gk[:, :, 6:] == 0).all() and (gv[:, :, 6:] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("L,S", [(0, 5), (0, 0), (3, 0)])
def test_empty_sequences(backend, L, S):
    q, k, v = qkv(2, 3, 3, L, S, 8, Dv=5)
    out, lse = attnlab.attention(q, k, v, return_lse=True, backend=backend)
    assert out.shape == (2, 3, L, 5) and lse.shape == (2, 3, L)
    assert (out == 0).all() and (lse == -math.inf).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("L,S", [(1, 1), (1, 7), (7, 1)])
def test_length_one(backend, L, S):
    q, k, v = qkv(1, 2, 2, L, S, 8)
    out, lse = attnlab.attention(q, k, v, return_lse=True, backend=backend)
    ref, ref_lse = oracle(q, k, v)
    assert_close(out, ref, atol=1e-5)
    assert_close(lse, ref_lse, atol=1e-5)


def test_causal_alignment():
    L, S = 3, 5
    tl = masks.causal().to_dense(L, S)[0, 0]
    br = masks.causal("bottom_right").to_dense(L, S)[0, 0]
    i, j = torch.arange(L)[:, None], torch.arange(S)[None]
    assert torch.equal(tl, j <= i)
    assert torch.equal(br, j <= i + (S - L))
    # is_causal is top-left, as SDPA
    q, k, v = qkv(1, 1, 1, L, S, 4)
    assert_close(attnlab.attention(q, k, v, is_causal=True),
                 attnlab.attention(q, k, v, mask=masks.causal("top_left")), atol=0)


def test_all_masks_apply_together():
    q, k, v = qkv(1, 2, 2, 8, 8, 4)
    both = attnlab.attention(q, k, v, is_causal=True, mask=masks.sliding_window(3),
                             attn_mask=torch.arange(8) != 2)
    allowed = masks.sliding_window(3).to_dense(8, 8) & (torch.arange(8) != 2)
    assert_close(both, oracle(q, k, v, allowed=allowed)[0], atol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_dropout_is_unbiased_and_seeded(backend):
    q, k, v = qkv(1, 1, 1, 4, 6, 3, dtype=torch.float64)
    base = attnlab.attention(q, k, v, backend=backend)
    torch.manual_seed(1)
    a = attnlab.attention(q, k, v, dropout_p=0.5, backend=backend)
    torch.manual_seed(1)
    b = attnlab.attention(q, k, v, dropout_p=0.5, backend=backend)
    assert torch.equal(a, b) and not torch.allclose(a, base)
    torch.manual_seed(2)
    n = 4000  # independent draws as a batch: (n, 1, L, D)
    many = attnlab.attention(*(x.expand(n, -1, -1, -1) for x in (q, k, v)), dropout_p=0.3,
                             backend=backend)
    assert_close(many.mean(0, keepdim=True), base, atol=0.06, what="mean output under dropout")
    assert many.std(0).mean() > 0.05  # the draws differ


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "tiled"])
def test_dropout_with_lse(backend):
    q, k, v = qkv(1, 2, 2, 8, 8, 4)
    torch.manual_seed(0)
    out, lse = attnlab.attention(q, k, v, dropout_p=0.5, return_lse=True, backend=backend)
    _, ref_lse = oracle(q, k, v)
    assert out.shape == (1, 2, 8, 4)
    assert_close(lse, ref_lse, atol=1e-5, what="lse (dropout acts after the softmax)")


def test_select_backend_explains_its_choice(monkeypatch):
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")  # the PyTorch path's rule (kernel: test_interval_*)
    q, k, v = qkv(1, 2, 2, 8, 8, 4)
    choice = attnlab.select_backend(q, k, v, is_causal=True)
    assert choice.backend == "sdpa" and "causal" in choice.reason
    choice = attnlab.select_backend(q, k, v, softcap=5.0)
    assert choice.backend == "tiled" and "softcap" in choice.reason
    assert attnlab.select_backend(q, k[..., :0, :], v[..., :0, :]).backend == "math"


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "tiled", "reference"])
def test_per_head_mask_with_gqa_and_poisoned_keys(backend):
    # 4 query heads in 2 KV groups: (0, 1) share k/v head 0, (2, 3) share k/v head 1
    q, k, v = qkv(1, 4, 2, 3, 5, 8)
    m = torch.ones(1, 4, 3, 5, dtype=torch.bool)
    m[..., 0] = False  # key 0 is dead for every head: poison there must not leak
    m[:, 0, :, 2] = False  # key 2 is dead for head 0 but alive for head 1 of the same group
    m[:, 3, :, 4] = False  # key 4 is dead for head 3 but alive for head 2
    m[:, 1, 1, 3] = False  # and some per-row holes
    k[..., 0, :] = float("nan")
    v[..., 0, :] = float("nan")
    out = attnlab.attention(q, k, v, attn_mask=m, enable_gqa=True, backend=backend)
    k0, v0 = k.clone(), v.clone()
    k0[..., 0, :] = 0
    v0[..., 0, :] = 0
    ref = oracle(q, k0, v0, allowed=m)[0]
    # head 1 borrows from key 2 and head 2 from key 4: zeroing those keys changes them
    k2 = k0.clone()
    k2[:, 0, 2], k2[:, 1, 4] = 0, 0
    assert (oracle(q, k2, v0, allowed=m)[0] - ref)[:, [1, 2]].abs().max() > 0.05
    assert_close(out, ref, atol=1e-5)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "tiled", "reference"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 300), (300,), (1, 300), (1, 1, 1, 1, 300)])
def test_row_broadcast_padding_mask_with_gqa(backend, shape):
    q, k, v = qkv(2, 8, 2, 300, 300, 16)
    keep = torch.arange(300) < 250
    out = attnlab.attention(q, k, v, attn_mask=keep.reshape(shape), enable_gqa=True,
                            backend=backend)
    assert out.shape == q.shape
    assert_close(out, oracle(q, k, v, allowed=keep)[0], atol=1e-5)


def test_extra_leading_mask_dims_keep_the_output_shape():
    q, k, v = (torch.randn(3, 5, 8) for _ in range(3))  # (H, L, D)
    m = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    for backend in ["auto", "sdpa", "math", "tiled", "reference"]:
        assert attnlab.attention(q, k, v, attn_mask=m, backend=backend).shape == (3, 5, 8)


def test_bottom_right_causal_runs_as_fused_causal_when_square(monkeypatch):
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")  # the PyTorch path's rule (kernel: test_interval_*)
    q, k, v = qkv(1, 2, 2, 8, 8, 4)
    assert attnlab.select_backend(q, k, v, mask=masks.causal("bottom_right")).backend == "sdpa"
    one = q[:, :, -1:]
    a = attnlab.attention(one, k, v, mask=masks.causal("bottom_right"))
    assert_close(a, attnlab.attention(q, k, v, is_causal=True)[:, :, -1:], atol=1e-6)


def test_attention_weights_with_a_column_broadcast_mask():
    q, k, v = qkv(1, 2, 2, 6, 9, 4)
    m = (torch.arange(6) < 4)[:, None]  # (L, 1): rows >= 4 attend nothing
    out, lse = attnlab.attention(q, k, v, attn_mask=m, return_lse=True)
    w = attnlab.attention_weights(q, k, lse, attn_mask=m)
    assert_close(w @ v, out, atol=1e-5)
    assert (w[:, :, 4:] == 0).all()
