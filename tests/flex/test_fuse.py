"""score_mods that are exactly softcap / ALiBi run as the kernels' built-in modifiers; anything
else, however close, stays a score_mod."""

from __future__ import annotations

import pytest
import torch

from attnlab.flex import flex_attention
from attnlab.flex.fuse import builtin_of
from attnlab.flexfn import Adapted

from helpers import close

SLOPES = torch.exp2(-(torch.arange(4) + 1) * 2.0)  # = 2^(-8(h+1)/H) for H = 4


def recognise(fn, H=4):
    return builtin_of(fn, Adapted(fn, score=True), H, torch.float32, "cpu")


def test_softcap_in_either_order():
    assert recognise(lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0)) == {"softcap": 30.0}
    assert recognise(lambda s, b, h, q, kv: torch.tanh(s / 5) * 5) == {"softcap": 5.0}


@pytest.mark.parametrize("fn", [
    lambda s, b, h, q, kv: s + (kv - q) * SLOPES[h],
    lambda s, b, h, q, kv: SLOPES[h] * (kv - q) + s,
    lambda s, b, h, q, kv: s + (kv - q) * torch.exp2(-((h + 1) * 8.0 / 4)),
])
def test_alibi_in_its_forms(fn):
    got = recognise(fn)
    assert set(got) == {"alibi_slopes"}
    close(got["alibi_slopes"], torch.exp2(-(torch.arange(4) + 1) * 2.0), atol=0)


def test_softcap_then_alibi_is_both():
    got = recognise(lambda s, b, h, q, kv: 20.0 * torch.tanh(s / 20.0) + (kv - q) * SLOPES[h])
    assert got["softcap"] == 20.0
    close(got["alibi_slopes"], SLOPES, atol=0)


learned = torch.ones(4, requires_grad=True)


@pytest.mark.parametrize("fn", [
    lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 20.0),  # two constants
    lambda s, b, h, q, kv: 30.0 * torch.tanh((s + (kv - q) * SLOPES[h]) / 30.0),  # order
    lambda s, b, h, q, kv: s + (q - kv) * SLOPES[h],  # (q - kv): not the kernel's sign
    lambda s, b, h, q, kv: s + (kv - q) * SLOPES[b],  # slopes read b
    lambda s, b, h, q, kv: s + (kv - q) * learned[h],  # a learned slope: kernels give no grad
    lambda s, b, h, q, kv: s + torch.dot(SLOPES, SLOPES),  # not traceable, not a modifier
    lambda s, b, h, q, kv: s * 2,
])
def test_anything_else_stays_a_score_mod(fn):
    assert recognise(fn) is None


def test_a_fused_call_equals_the_same_function_run_as_a_score_mod():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 150, 16, generator=g, dtype=torch.float64) for _ in range(3))

    def mod(s, b, h, qi, ki):
        return 8.0 * torch.tanh(s / 8.0) + (ki - qi) * SLOPES[h]

    fused = flex_attention(q, k, v, score_mod=mod)
    as_mod = flex_attention(q, k, v, score_mod=Adapted(mod, score=True))  # not fused
    close(fused, as_mod, atol=1e-12)
