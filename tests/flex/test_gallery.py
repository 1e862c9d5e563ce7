"""attention-gym's masks and mods and PyTorch's Flex test functions, unchanged, through
attnlab.flex_attention: the forward equals torch's eager flex_attention (1e-5 in fp32), and the
forward and backward meet FlashAttention's rule against a float64 dense reference (error at
most 2× a plain fp32 implementation's, gradients 3×, also into captured tensors)."""

from __future__ import annotations

import warnings

import pytest
import torch

from attnlab.flex import create_block_mask, flex_attention, select_backend
from flex_gallery import CASES, dense_reference

from helpers import assert_fa_rule, close


def block_mask_of(case):
    if case.mask_mod is None:
        return None
    B, H = (case.B, case.H) if case.mask_bh else (None, None)
    return create_block_mask(case.mask_mod, B, H, case.L, case.S, device="cpu")


def inputs(case, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    D = 16
    q = torch.randn(case.B, case.H, case.L, D, generator=g, dtype=dtype)
    k = torch.randn(case.B, case.Hkv, case.S, D, generator=g, dtype=dtype)
    v = torch.randn(case.B, case.Hkv, case.S, D, generator=g, dtype=dtype)
    return q, k, v


def torch_eager(q, k, v, **kw):
    from torch.nn.attention.flex_attention import flex_attention as torch_flex

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch_flex(q, k, v, **kw)


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_equals_torch_eager_flex(name):
    case = CASES[name]
    q, k, v = inputs(case, torch.float32)
    bm = block_mask_of(case)
    ours, lse = flex_attention(q, k, v, score_mod=case.score_mod, block_mask=bm,
                               enable_gqa=case.Hkv != case.H, return_lse=True)
    want, want_lse = torch_eager(q, k, v, score_mod=case.score_mod, block_mask=bm,
                                 enable_gqa=case.Hkv != case.H, return_lse=True)
    close(ours, want, atol=1e-5, what=f"{name}: output")
    live = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), live), f"{name}: rows with nothing to attend"
    close(lse[live], want_lse[live], atol=1e-5, what=f"{name}: lse")


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_backward_meet_the_flash_attention_rule(name):
    case = CASES[name]
    x32 = [t.requires_grad_() for t in inputs(case, torch.float32, seed=1)]
    x64 = [t.detach().double().requires_grad_() for t in x32]
    bm = block_mask_of(case)
    gqa = case.Hkv != case.H
    caps = [c.requires_grad_() for c in case.captured]
    try:
        out = flex_attention(*x32, score_mod=case.score_mod, block_mask=bm, enable_gqa=gqa)
        dout = torch.randn_like(out)
        got = torch.autograd.grad(out, [*x32, *caps], dout)
        ref, _ = dense_reference(*x64, case.mask_mod, case.score_mod)
        want = torch.autograd.grad(ref, [*x64, *caps], dout.double())
        plain = [t.detach().requires_grad_() for t in x32]
        p_out, _ = dense_reference(*plain, case.mask_mod, case.score_mod)
        p_grads = torch.autograd.grad(p_out, [*plain, *caps], dout)
    finally:
        for c in caps:
            c.requires_grad_(False)
    assert_fa_rule(out, p_out, ref.detach(), 2, torch.float32, what=f"{name}: output")
    for what, g, p, w in zip(["dq", "dk", "dv"] + ["captured"] * len(caps), got, p_grads,
                             want):
        assert_fa_rule(g, p, w.detach(), 3, torch.float32, what=f"{name}: {what}")


def test_scalar_only_functions_take_the_vmap_form_and_say_so():
    case = CASES["gym flamingo"]
    q, k, v = inputs(case, torch.float32)
    why = select_backend(q, k, v, block_mask=block_mask_of(case)).reason
    assert "vmap form" in why and "interval kernel" in why, why
    case = CASES["gym mla rope"]
    q, k, v = inputs(case, torch.float32)
    assert "score_mod mod: vmap form" in select_backend(q, k, v, score_mod=case.score_mod).reason
    case = CASES["gym sliding_window"]
    q, k, v = inputs(case, torch.float32)
    why = select_backend(q, k, v, block_mask=block_mask_of(case)).reason
    assert "mask_mod mask: broadcast form" in why and "interval kernel" in why, why
