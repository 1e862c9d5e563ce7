"""The block backward from a given global out and lse: PyTorch's CPU flash backward (where it
applies) and the plain PyTorch path agree, on masked blocks with rows that attend nothing."""

import pytest
import torch

from attnlab.distributed import blocks


def _case(dtype, masked):
    g = torch.Generator().manual_seed(3)
    B, H, L, S, D = 2, 3, 7, 11, 16
    q, do, out = (torch.randn(B, H, L, D, generator=g, dtype=dtype) for _ in range(3))
    k, v = (torch.randn(B, H, S, D, generator=g, dtype=dtype) for _ in range(2))
    lse = torch.randn(B, H, L, generator=g, dtype=dtype) + 3  # a global lse (other blocks too)
    allowed = None
    if masked:
        allowed = torch.rand(B, 1, L, S, generator=g) > 0.4
        allowed[:, :, 2] = False  # a row with nothing here...
        lse[:, :, 2] = float("-inf")  # ...and nowhere else either
    return q, k, v, allowed, out, lse, do, torch.zeros_like(lse)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("masked", [False, True])
def test_fused_and_plain_block_backward_agree(dtype, masked, monkeypatch):
    q, k, v, allowed, out, lse, do, dlse = _case(dtype, masked)
    assert blocks._fused_ok(q, k, v, None, dlse)
    fused = blocks.block_backward(q, k, v, allowed, 0.25, None, out, lse, do, dlse)
    monkeypatch.setattr(blocks, "_fused_ok", lambda *a: False)  # the plain path
    plain = blocks.block_backward(q, k, v, allowed, 0.25, None, out, lse, do, dlse)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for a, b in zip(fused, plain):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    if masked:
        assert (fused[0][:, :, 2] == 0).all()


def test_fused_path_steps_aside_for_softcap_lse_gradient_and_groups():
    q, k, v, _, _, _, _, dlse = _case(torch.float64, False)
    assert not blocks._fused_ok(q, k, v, 30.0, dlse)
    assert not blocks._fused_ok(q, k, v, None, dlse + 1)
    assert not blocks._fused_ok(q, k[:, :1], v[:, :1], None, dlse)
