"""The tiled loop's bf16 forward and backward accumulate in fp32: on PyTorch's fused kernel each
key chunk's share of the output and of dq (and each row block's share of dk, dv) was rounded to
bf16 before the sum.

The inputs make two key chunks whose dq shares are large and cancel (keys nearly equal, values
of opposite sign on the two sides of a one-tile gap, so Σ_j dS_ij = 0 splits into two big
halves): a bf16 rounding of each share is then an error as large as dq itself, while a plain
bf16 implementation, which sums the products in fp32, stays close. Checked by FlashAttention's
rule (error against float64 at most 3x the plain same-dtype implementation's)."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.ops import fused_cpu

from helpers import assert_fa_rule, plain_attention

L, S, D, GAP = 256, 2048, 64, 1024


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    q = rnd(1, 2, L, D) * 0.3
    k = rnd(1, 2, 1, D) + 0.05 * rnd(1, 2, S, D)  # nearly one key: the dq shares cancel
    u = rnd(D)
    side = torch.where(torch.arange(S) < GAP, 1.0, -1.0).double()  # (S,)
    v = side[:, None] * u + 0.05 * rnd(1, 2, S, D)  # (S, D) -> (1, 2, S, D)
    dout = u + 0.1 * rnd(1, 2, L, D)
    return q, k, v, dout


def _mask():
    return masks.from_function(lambda b, h, i, j: (j < GAP) | (j >= GAP + 64))  # a one-tile gap


@pytest.mark.parametrize("seed", [0, 1])
def test_bf16_forward_on_two_key_chunks_within_the_rule(seed):
    q, k, v, _ = _inputs(seed)
    allowed = _mask().to_dense(L, S)
    ref = plain_attention(q, k, v, allowed=allowed)
    plain = plain_attention(*(x.bfloat16() for x in (q, k, v)), allowed=allowed)
    out = attnlab.attention(*(x.bfloat16() for x in (q, k, v)), mask=_mask(), backend="tiled")
    assert_fa_rule(out, plain, ref, 2, torch.bfloat16)


@pytest.mark.parametrize("seed", [0, 1])
def test_bf16_backward_on_two_key_chunks_within_the_rule(seed):
    mask = _mask()
    q, k, v, dout = _inputs(seed)
    allowed = mask.to_dense(L, S)
    ref = [x.clone().requires_grad_(True) for x in (q, k, v)]
    plain_attention(*ref, allowed=allowed).backward(dout)
    plain = [x.to(torch.bfloat16).requires_grad_(True) for x in (q, k, v)]
    plain_attention(*plain, allowed=allowed).backward(dout.bfloat16())
    got = [x.to(torch.bfloat16).requires_grad_(True) for x in (q, k, v)]
    p = attnlab.ops.validate.make_problem(*got, None, 0.0, False, None, False, mask=mask)
    assert fused_cpu.applies(p)
    chunks = attnlab.ops.tiled.plan_for(p, fused=True).rows[0][2]
    assert len(chunks) == 2, chunks  # the gap splits the keys: two chunks per row block
    attnlab.attention(*got, mask=mask, backend="tiled").backward(dout.bfloat16())
    for name, a, b, r in zip(("dq", "dk", "dv"), got, plain, ref):
        assert_fa_rule(a.grad, b.grad, r.grad, 3, torch.bfloat16, what=name)
