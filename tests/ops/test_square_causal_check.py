"""The C serve's NaN/Inf check of a square causal call (csrc/serve.cpp): the query and keys are
checked before SDPA's kernel, the values through the output's last row after it (that row sees
every key: a NaN/Inf value reaches it, through a zero weight too). The rule's premise is checked
on SDPA itself; each poisoned input gives what the full path gives, forward and backward; and
the cases that the output alone would miss (an Inf key whose scores are -inf, a NaN query row)
or that are not square keep their checks before the kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab import masks
from attnlab.ops import cheap

BAD = [float("nan"), float("inf"), float("-inf")]


@pytest.fixture(autouse=True)
def _fresh():
    from attnlab.ops import kernels

    if not kernels.available():
        pytest.skip("the kernel is not available here")
    cheap.clear()
    yield
    cheap.clear()


def _qkv(L, S=None, H=2, Hkv=None, D=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    S, Hkv = S or L, Hkv or H
    return [torch.randn(1, h, n, D, generator=g).to(dtype)
            for h, n in ((H, L), (Hkv, S), (Hkv, S))]


def _served(q, k, v, **kw):
    a = {"dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False, "mask": None,
         "softcap": None, "return_lse": False, **kw}
    return cheap.serve(q, k, v, *a.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("L, H, Hkv, D", [(1, 2, 2, 8), (7, 2, 2, 8), (33, 4, 2, 16),
                                          (64, 8, 8, 64)])
def test_a_nonfinite_value_shows_in_the_last_row_of_sdpas_square_causal_output(L, H, Hkv, D,
                                                                                 dtype):
    q, k, v = _qkv(L, H=H, Hkv=Hkv, D=D, dtype=dtype)
    far = (-1e4 * q[0, 0, -1] / q[0, 0, -1].float().norm()).to(dtype)  # a score of ~ -1e4·√D
    for j in range(L):
        for bad in BAD:
            for zero_weight in (False, True):  # the last row's weight of key j: exp(-1e4) = 0
                kk, vv = k.clone(), v.clone()
                if zero_weight:
                    kk[0, 0, j] = far
                vv[0, 0, j, D // 2] = bad
                out = F.scaled_dot_product_attention(q, kk, vv, is_causal=True,
                                                     enable_gqa=Hkv != H)
                assert not torch.isfinite(out[0, :H // Hkv, -1]).all(), (j, bad, zero_weight)


def _grads(q, k, v, **kw):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = attnlab.attention(q, k, v, **kw)
    g = torch.linspace(-1, 1, out.numel()).view(out.shape)
    return (out, *torch.autograd.grad(out, (q, k, v), g))


def _same(got, want):
    for a, b in zip(got, want):
        assert torch.equal(torch.isnan(a), torch.isnan(b))
        assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))


@pytest.mark.parametrize("kw", [{"is_causal": True}, {"mask": masks.causal()}])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("L", [1, 5])
def test_each_poisoned_input_of_a_served_square_call_gets_the_full_paths_answer(L, grad, kw):
    q, k, v = _qkv(L)
    run = _grads if grad else (lambda *x, **a: (attnlab.attention(*x, **a),))
    run(q, k, v, **kw)  # the plan
    assert type(_served(*(x.requires_grad_(grad) for x in (q, k, v)), **kw)) is torch.Tensor
    q, k, v = (x.detach() for x in (q, k, v))
    for which in range(3):
        for j in range(L):
            for bad in BAD:
                xs = [x.clone() for x in (q, k, v)]
                xs[which][0, 1, j, 3] = bad
                assert _served(*xs, **kw)[-1] == "N"  # not served: the full path's rules
                got = run(*xs, **kw)
                cheap.clear()
                want = run(*xs, **kw)  # the full path
                _same(got, want)
                if which:  # a key or value: the rows before it clean, the rows after it NaN
                    assert not torch.isnan(got[0][0, 1, :j]).any()
                    assert torch.isnan(got[0][0, 1, j:]).all()
                else:
                    assert torch.isnan(got[0][0, 1, j]).all()


def test_an_inf_key_whose_scores_are_all_minus_inf_is_caught_before_the_kernel():
    """Such a key leaves SDPA's output finite (its weights are all 0): only the check of the keys
    before the kernel makes the rows that see it NaN, as the rules say."""
    q, k, v = _qkv(4)
    q = q.abs() + 0.1  # every query component positive
    attnlab.attention(q, k, v, is_causal=True)  # the plan
    k[0, 1, 2] = float("-inf")  # key 2's scores: -inf in every row
    assert torch.isfinite(F.scaled_dot_product_attention(q, k, v, is_causal=True)).all()
    got = attnlab.attention(q, k, v, is_causal=True)
    assert torch.isnan(got[0, 1, 2:]).all() and not torch.isnan(got[0, 1, :2]).any()
    assert not torch.isnan(got[0, 0]).any()


def test_finite_inputs_whose_scores_overflow_give_sdpas_output_as_before():
    q, k, v = _qkv(3)
    k = k.abs() + 0.5
    attnlab.attention(q, k, v, is_causal=True)  # the plan
    q[0, 0, 2] = 3e38  # the last row's scores overflow to +Inf: its output is NaN
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.isnan(want[0, 0, 2]).any()
    assert _served(q, k, v, is_causal=True)[-1] == "F"  # the inputs are finite: the plan's path
    got = attnlab.attention(q, k, v, is_causal=True)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))


@pytest.mark.parametrize("grad", [False, True])
def test_a_value_no_row_attends_in_a_longer_cache_is_checked_before_the_kernel(grad):
    """Not square (S > L, top-left): no output row sees values L.., so a poisoned one is found
    before the kernel and the full path zeroes it: its output and gradients stay finite."""
    q, k, v = _qkv(3, S=8)
    run = _grads if grad else (lambda *x, **a: (attnlab.attention(*x, **a),))
    run(q, k, v, is_causal=True)  # the plan
    for bad in BAD:
        vv = v.clone()
        vv[0, 1, 6, 0] = bad
        assert _served(q, k, vv, is_causal=True)[-1] == "N"
        got = run(q, k, vv, is_causal=True)
        assert all(torch.isfinite(x).all() for x in got)
