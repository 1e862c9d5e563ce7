"""Every backend against the float64 oracle, with FlashAttention's rule, over the shapes where
kernels break: odd lengths and head dims, L != S both ways, MHA/GQA/MQA, every mask kind."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks

from helpers import assert_close, assert_fa_rule, oracle, plain_attention, qkv

BACKENDS = ["auto", "sdpa", "math"]

# (L, S, D): every length and head dim of DESIGN.md's matrix appears at least once
SHAPES = [
    (1, 1, 32),
    (1, 97, 64),
    (97, 1, 59),
    (97, 97, 111),
    (113, 203, 128),
    (203, 113, 256),
    (1023, 1024, 64),
    (1025, 1025, 32),
    (127, 129, 59),  # around a 128 block boundary
]
HEADS = [(4, 4), (4, 2), (4, 1)]  # MHA, GQA, MQA


def _run(backend, q, k, v, **kw):
    return attnlab.attention(q, k, v, backend=backend, enable_gqa=q.shape[1] != k.shape[1], **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("L,S,D", SHAPES)
def test_forward_shapes_fp32(backend, L, S, D):
    q, k, v = qkv(1, 2, 2, L, S, D, seed=L + S + D)
    out = _run(backend, q, k, v)
    ref, _ = oracle(q, k, v)
    assert_fa_rule(out, plain_attention(q, k, v), ref, 2, torch.float32)


# the lse accumulates in fp32 for fp16/bf16 inputs: its error is fp32 rounding (measured ≈5e-7),
# far below a bf16-rounded lse (≈1e-2), so one fp32 bound holds for every low precision
LSE_DTYPE = {torch.float64: torch.float64, torch.float32: torch.float32,
             torch.bfloat16: torch.float32, torch.float16: torch.float32}
LSE_TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 1e-5, torch.float16: 1e-5}


@pytest.mark.parametrize("backend", [*BACKENDS, "tiled"])
@pytest.mark.parametrize("H,Hkv", HEADS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_forward_heads_dtypes(backend, H, Hkv, dtype):
    q, k, v = qkv(2, H, Hkv, 67, 45, 40, Dv=24, dtype=dtype, seed=H * 10 + Hkv)
    out, lse = _run(backend, q, k, v, is_causal=False, return_lse=True)
    assert out.dtype == dtype and out.shape == (2, H, 67, 24)
    assert lse.dtype == LSE_DTYPE[dtype] and lse.shape == (2, H, 67)
    ref, ref_lse = oracle(q, k, v)
    assert_fa_rule(out, plain_attention(q, k, v), ref, 2, dtype)
    tol = LSE_TOL[dtype]
    assert_close(lse, ref_lse, atol=tol, rtol=tol, what="lse")


def _mask_cases(B, L, S):
    g = torch.Generator().manual_seed(7)
    dense = torch.rand(B, 1, L, S, generator=g) > 0.3
    dense[..., 0] = True  # every row sees something: fully masked rows have their own tests
    seg = torch.sort(torch.randint(0, 4, (B, S), generator=g), dim=-1).values
    return {
        "causal_tl": masks.causal(),
        "causal_br": masks.causal("bottom_right"),
        "sliding": masks.sliding_window(16, "bottom_right"),
        "padding": masks.padding(key_lengths=[S, max(1, S // 2)]),
        "document": masks.document(seg) if L == S else masks.document(seg[:, :L], seg),
        "prefix_lm": masks.prefix_lm([5, 9], align="bottom_right"),
        "dense": masks.from_dense(dense),
        "combined": masks.causal("bottom_right") & ~masks.sliding_window(4, "bottom_right")
        | masks.padding(key_lengths=[3, 1]),
    }


# PyTorch's fused CPU backward recomputes the weights from an fp32 log-sum-exp; in fp32 its gradient
# error measured 1.2x-4.4x a plain fp32 implementation's (~1e-6 relative). FlashAttention states its
# 3x rule for fp16/bf16, where the fused kernel stays within it; fp32 gets this measured bound.
FUSED_FP32_GRAD_FACTOR = 5


def _grad_factor(backend, dtype):
    return FUSED_FP32_GRAD_FACTOR if backend != "math" and dtype == torch.float32 else 3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", list(_mask_cases(2, 4, 4)))
@pytest.mark.parametrize("L,S,dtype", [(70, 70, torch.float32), (33, 90, torch.float32),
                                       (70, 70, torch.bfloat16)])
def test_structured_masks_forward_backward(backend, kind, L, S, dtype):
    mask = _mask_cases(2, L, S)[kind]
    q, k, v = qkv(2, 4, 2, L, S, 48, dtype=dtype, seed=len(kind) * 31 + L, requires_grad=True)
    allowed = mask.to_dense(L, S)  # (Bm, Hm, L, S)
    live = allowed.any(-1, keepdim=True)  # rows that see something
    out = _run(backend, q, k, v, mask=mask)
    ref, _ = oracle(q, k, v, allowed=allowed)
    plain = torch.where(live, plain_attention(q, k, v, allowed=allowed), 0.0)
    assert_fa_rule(out, plain, ref, 2, dtype)

    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out64 = _run("math", q64, k64, v64, mask=mask)  # the float64 gradient oracle
    grads64 = torch.autograd.grad(out64, (q64, k64, v64), dout.double())
    qp, kp, vp = (t.detach().clone().requires_grad_() for t in (q, k, v))
    outp = torch.where(live, plain_attention(qp, kp, vp, allowed=allowed), 0.0)
    gradsp = torch.autograd.grad(outp, (qp, kp, vp), dout)
    for name, g, gp, g64 in zip("qkv", grads, gradsp, grads64):
        assert_fa_rule(g, torch.nan_to_num(gp), g64, _grad_factor(backend, dtype), dtype,
                       what=f"grad {name}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bool_mask", [True, False])
def test_sdpa_dense_mask_meaning(backend, bool_mask):
    q, k, v = qkv(2, 3, 3, 20, 31, 16)
    g = torch.Generator().manual_seed(3)
    if bool_mask:
        m = torch.rand(20, 31, generator=g) > 0.4
        m[:, 0] = True
    else:
        m = torch.randn(2, 1, 20, 31, generator=g)
    out = _run(backend, q, k, v, attn_mask=m)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
    assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", [*BACKENDS, "reference"])
@pytest.mark.parametrize("scale", [None, 1.0, 0.05])
def test_is_causal_and_scale_match_sdpa(backend, scale):
    q, k, v = qkv(1, 2, 2, 30, 41, 24)
    out = _run(backend, q, k, v, is_causal=True, scale=scale)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_leading_dims_and_2d(backend):
    q, k, v = (torch.randn(3, 2, 4, 9, 8) for _ in range(3))  # (B1, B2, H, L, D)
    out = _run(backend, q, k, v, is_causal=True)
    assert out.shape == (3, 2, 4, 9, 8)
    assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                 atol=1e-5)
    q2, k2, v2 = q[0, 0, 0], k[0, 0, 0], v[0, 0, 0]  # (L, D)
    out2 = _run(backend, q2[None], k2[None], v2[None])[0]
    assert_close(attnlab.attention(q2, k2, v2, backend=backend), out2, atol=1e-6)


def test_gradcheck_math_float64():
    q, k, v = qkv(1, 2, 1, 5, 7, 3, dtype=torch.float64, requires_grad=True)
    mask = masks.causal("bottom_right") & masks.padding(key_lengths=[6])
    f = lambda q, k, v: attnlab.attention(q, k, v, mask=mask, enable_gqa=True,  # noqa: E731
                                          backend="math", return_lse=True)
    assert torch.autograd.gradcheck(f, (q, k, v))
