"""The block backward from a given global out and lse (and their gradients): each key block's
dk, dv and share of dq equal float64 autograd of the whole attention, for MHA, GQA, MQA, softcap,
an lse gradient and masked blocks with rows that attend nothing (and NaN in keys no row attends);
equal heads run one flash-kernel call per block (an lse gradient included), grouped heads and
softcap the tiled backward (no copy of k/v per head), never a plain whole-block path."""

import pytest
import torch

from attnlab.distributed import blocks
from attnlab.ops import fused_cpu, tiled

NEG = float("-inf")


def _whole(q, k, v, allowed, scale, softcap):
    """(out, lse) of attention over every key, float64 autograd of the definition."""
    G = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(G, 1).transpose(-2, -1) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~allowed, NEG)
    alive = (s > NEG).any(-1, keepdim=True)
    s = torch.where(alive, s, 0.0)
    lse = torch.logsumexp(s, -1, keepdim=True)
    w = torch.where(alive & allowed, torch.exp(s - lse), 0.0)
    return w @ v.repeat_interleave(G, 1), torch.where(alive, lse, NEG).squeeze(-1)


CASES = [(Hkv, softcap, with_dlse) for Hkv in (4, 2, 1) for softcap in (None, 3.0)
         for with_dlse in (False, True)
         if not (Hkv == 4 and softcap is None and not with_dlse)]  # that one: test_exact's


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("Hkv,softcap,with_dlse", CASES)
def test_blocks_add_up_to_the_whole_backward(dtype, Hkv, softcap, with_dlse, monkeypatch):
    g = torch.Generator().manual_seed(3)
    B, H, L, S, D, cut, scale = 2, 4, 7, 12, 16, 5, 0.25
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    allowed = torch.rand(B, 1, L, S, generator=g) > 0.4
    allowed[:, :, 2] = False  # a row with nothing anywhere
    allowed[0, :, 4, :cut] = False  # a row with nothing in the first block only
    allowed[..., S - 1] = False  # a key no row attends: NaN/Inf there must reach nothing
    do = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    dlse = torch.randn(B, H, L, generator=g, dtype=torch.float64) if with_dlse else None
    out, lse = _whole(q, k, v, allowed, scale, softcap)
    want = torch.autograd.grad([out, lse], (q, k, v),
                               [do, torch.zeros_like(lse) if dlse is None else dlse])
    calls = []  # which backward each block ran on
    real_tiled, real_fused = tiled.backward, fused_cpu.backward
    monkeypatch.setattr(tiled, "backward",
                        lambda *a, **kw: calls.append("tiled") or real_tiled(*a, **kw))
    monkeypatch.setattr(fused_cpu, "backward", lambda *a, **kw: calls.append(
        "fused" + ("+dlse" if kw.get("dlse") is not None else "")) or real_fused(*a, **kw))
    c = lambda x: x.detach().to(dtype)  # noqa: E731
    k, v = k.detach().clone(), v.detach().clone()
    k[:, :, S - 1], v[:, :, S - 1] = float("nan"), float("inf")
    dq = torch.zeros(B, H, L, D, dtype=dtype)
    for cols in (slice(0, cut), slice(cut, S)):
        gq, gk, gv = blocks.block_backward(
            c(q), c(k[:, :, cols]), c(v[:, :, cols]), allowed[..., cols], scale, softcap,
            c(out), c(lse), c(do), None if dlse is None else c(dlse))
        tol = 1e-12 if dtype == torch.float64 else 2e-5
        for a, b in ((gk, want[1][:, :, cols]), (gv, want[2][:, :, cols])):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b.to(dtype), rtol=tol, atol=tol)
        dq += gq
    torch.testing.assert_close(dq, want[0].to(dtype), rtol=tol, atol=tol)
    assert (dq[:, :, 2] == 0).all()
    if Hkv == H and softcap is None:  # one kernel call per block, the lse gradient folded in
        assert calls == ["fused+dlse"] * 2
    else:  # grouped heads and softcap: the tiled backward, never a plain whole-block path
        assert calls[0] == "tiled" and calls.count("tiled") == 2
