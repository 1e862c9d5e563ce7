"""Backend "tiled" forward against the float64 oracle (FlashAttention's 2× rule), on both inner
paths (PyTorch's fused kernel per chunk, and plain PyTorch ops), over the shapes where kernels
break, every mask kind, tile-boundary lengths, GQA/MQA, and NaN poisoning."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.ops import tiled
from attnlab.ops.api import make_problem
from attnlab.ops.tiled.plan import BLOCK_K, BLOCK_Q

from helpers import assert_close, assert_fa_rule, oracle, plain_attention, qkv

PATHS = [True, False]  # fused inner kernel, pure PyTorch


def run_tiled(q, k, v, fused, mask=None, attn_mask=None, is_causal=False, **kw):
    p = make_problem(q, k, v, attn_mask, 0.0, is_causal, None, q.shape[-3] != k.shape[-3],
                     mask=mask, **kw)
    return tiled.forward(p, fused=fused)


def dense_of(mask, L, S):
    return None if mask is None else mask.to_dense(L, S)


def check(q, k, v, fused, mask=None, attn_mask=None, is_causal=False):
    L, S = q.shape[-2], k.shape[-2]
    out, lse = run_tiled(q, k, v, fused, mask=mask, attn_mask=attn_mask, is_causal=is_causal)
    m = masks.causal() & mask if is_causal and mask is not None else (
        masks.causal() if is_causal else mask)
    allowed = dense_of(m, L, S)
    bias = None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        allowed = attn_mask if allowed is None else allowed & attn_mask
    elif attn_mask is not None:
        bias = attn_mask
    ref, ref_lse = oracle(q, k, v, allowed=allowed, bias=bias)
    plain = plain_attention(q, k, v, allowed=allowed, bias=bias)
    plain = torch.nan_to_num(plain)  # plain softmax gives NaN on fully masked rows; oracle 0
    assert not torch.isnan(out).any()
    assert_fa_rule(out, plain, ref, 2.0, q.dtype)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), "lse: -inf exactly on fully masked rows"
    assert_close(lse[finite], ref_lse[finite], atol=1e-4, rtol=1e-5, what="lse")
    assert bool((out.double()[~finite] == 0).all()), "fully masked rows must give output 0"
    return out, lse


SHAPES = [(1, 1, 32), (1, 97, 64), (97, 1, 59), (113, 203, 111), (203, 113, 128), (97, 97, 256)]


@pytest.mark.parametrize("fused", PATHS)
@pytest.mark.parametrize("L,S,D", SHAPES)
def test_shapes_full_and_causal(fused, L, S, D):
    q, k, v = qkv(1, 2, 2, L, S, D, seed=L * 7 + S + D)
    check(q, k, v, fused)
    check(q, k, v, fused, is_causal=True)
    check(q, k, v, fused, mask=masks.causal("bottom_right"))


BOUNDARY = sorted({BLOCK_Q - 1, BLOCK_Q, BLOCK_Q + 1, BLOCK_K - 1, BLOCK_K + 1, 2 * BLOCK_Q + 1})


@pytest.mark.parametrize("fused", PATHS)
@pytest.mark.parametrize("L", BOUNDARY)
def test_tile_boundaries(fused, L):
    S = 2 * BLOCK_K + 1 if L % 2 else BLOCK_K - 1
    q, k, v = qkv(1, 2, 1, L, S, 32, seed=L)
    check(q, k, v, fused, mask=masks.sliding_window(40, align="bottom_right"))
    check(q, k, v, fused, mask=masks.causal())


def every_mask(B, L, S):
    doc_q = torch.arange(L) * 3 // max(L, 1)
    doc_k = torch.arange(S) * 3 // max(S, 1)
    g = torch.Generator().manual_seed(3)
    return {
        "causal": masks.causal(),
        "causal_br": masks.causal(align="bottom_right"),
        "window": masks.sliding_window(70),
        "window_br": masks.sliding_window(33, align="bottom_right"),
        "padding": masks.padding(key_lengths=[S, S // 3], query_lengths=[L // 2, L]),
        "document": masks.document(doc_q, doc_k),
        "document_causal": masks.document(doc_q, doc_k) & masks.causal(),
        "unsorted_doc": masks.document(torch.arange(L) % 3, torch.arange(S) % 3),
        "prefix_lm": masks.prefix_lm([5, 40]),
        "not_window": ~masks.sliding_window(20),
        "dense": masks.from_dense(torch.rand(B, 1, L, S, generator=g) < 0.3),
    }


@pytest.mark.parametrize("fused", PATHS)
@pytest.mark.parametrize("name", list(every_mask(2, 8, 8)))
def test_every_mask_gqa(fused, name):
    L, S = 150, 197
    q, k, v = qkv(2, 4, 2, L, S, 24, seed=len(name))
    check(q, k, v, fused, mask=every_mask(2, L, S)[name])


@pytest.mark.parametrize("fused", PATHS)
def test_dense_attn_masks_and_mqa(fused):
    L, S = 140, 90
    q, k, v = qkv(2, 3, 1, L, S, 16, seed=5)
    g = torch.Generator().manual_seed(0)
    bool_mask = torch.rand(L, S, generator=g) < 0.5
    float_mask = torch.randn(2, 1, L, S, generator=g).masked_fill(~bool_mask, float("-inf"))
    check(q, k, v, fused, attn_mask=bool_mask)
    check(q, k, v, fused, attn_mask=float_mask, mask=masks.sliding_window(60))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_accumulates_in_fp32(dtype):
    q, k, v = qkv(1, 2, 2, 200, 200, 64, dtype=dtype, seed=9)
    for fused in PATHS:
        out, lse = check(q, k, v, fused, mask=masks.sliding_window(90))
        assert out.dtype == dtype and lse.dtype == torch.float32


def test_nan_in_masked_keys_never_reaches_output():
    L, S = 130, 260
    q, k, v = qkv(2, 2, 2, L, S, 16, seed=11)
    k[0, :, 100:] = float("nan")
    v[0, :, 100:] = float("inf")
    k[1, :, 200:] = float("-inf")
    v[1, :, 200:] = float("nan")
    pad = masks.padding(key_lengths=[100, 200])
    for fused in PATHS:
        out, _ = run_tiled(q, k, v, fused, mask=pad)
        assert not torch.isnan(out).any() and torch.isfinite(out).all()
        out, _ = run_tiled(q, k, v, fused, mask=pad & masks.sliding_window(64))
        assert torch.isfinite(out).all()
        ref, _ = oracle(q, k, v, allowed=pad.to_dense(L, S))
        assert_close(run_tiled(q, k, v, fused, mask=pad)[0], ref, atol=1e-5, what="poisoned")


def test_fully_masked_and_empty():
    q, k, v = qkv(1, 2, 2, 5, 7, 8)
    out, lse = attnlab.attention(q, k, v, mask=masks.padding(key_lengths=[0]), backend="tiled",
                                 return_lse=True)
    assert bool((out == 0).all()) and bool((lse == float("-inf")).all())
    q0 = torch.randn(1, 2, 0, 8)
    assert attnlab.attention(q0, k, v, backend="tiled").shape == (1, 2, 0, 8)
    k0 = torch.randn(1, 2, 0, 8)
    out = attnlab.attention(q, k0, k0, backend="tiled")
    assert out.shape == (1, 2, 5, 8) and bool((out == 0).all())


@pytest.mark.parametrize("shape", [(9, 16), (3, 9, 16), (2, 3, 2, 9, 16)])
def test_any_leading_dims(shape):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(shape, generator=g)
    k = torch.randn((*shape[:-2], 11, 16), generator=g)
    v = torch.randn((*shape[:-2], 11, 16), generator=g)
    want = attnlab.attention(q, k, v, mask=masks.causal("bottom_right"), backend="math")
    got = attnlab.attention(q, k, v, mask=masks.causal("bottom_right"), backend="tiled")
    assert_close(got, want, atol=1e-5, what="leading dims")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_merges_several_chunks_per_row_block(dtype):
    # past MIN_FREE keys, a causal row block runs a mask-free chunk and a masked diagonal chunk
    # whose partial results merge through their lse
    from attnlab.ops.tiled.plan import MIN_FREE, make_plan

    L = MIN_FREE + 2 * BLOCK_Q + 3
    q, k, v = qkv(1, 2, 1, L, L, 16, dtype=dtype, seed=12)
    p = make_problem(q, k, v, None, 0.0, True, None, True, mask=None)
    assert max(len(c) for _, _, c in make_plan(p, fused=True).rows) >= 2
    check(q, k, v, True, is_causal=True)


def test_padded_query_rows_across_several_chunks():
    # B·H = 64 heads cap a masked chunk's width below L, so every row block walks several chunks;
    # the last 3 query rows are padding: -inf from every chunk must merge to -inf, not NaN
    from attnlab.ops.tiled.plan import make_plan

    L = 700
    q, k, v = qkv(4, 16, 16, L, L, 8, seed=70)
    mask = masks.padding(query_lengths=[L - 3] * 4)
    p = make_problem(q, k, v, None, 0.0, False, None, False, mask=mask)
    last = make_plan(p, fused=True).rows[-1]
    assert last[1] == L and len(last[2]) >= 2, "the padded rows must meet several chunks"
    out, lse = attnlab.attention(q, k, v, mask=mask, return_lse=True, backend="tiled")
    assert not out.isnan().any() and not lse.isnan().any()
    assert bool((out[:, :, -3:] == 0).all()) and bool((lse[:, :, -3:] == float("-inf")).all())
    want, want_lse = attnlab.attention(q, k, v, return_lse=True, backend="math")
    assert_close(out[:, :, :-3], want[:, :, :-3], atol=1e-5, what="real rows")
    assert_close(lse[:, :, :-3], want_lse[:, :, :-3], atol=1e-5, what="real rows' lse")
