"""Edges of the op that only a targeted case reaches: attention_weights with both kinds of mask
and odd row requests, 5-D inputs with a per-batch mask on the fused path, backward through several
fused chunks, dropout_p=1, float64 in the pure tiled path, and where "auto" switches backends."""

from __future__ import annotations

import math

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks
from attnlab.ops import budget, dispatch, tiled
from attnlab.ops.api import make_problem
from attnlab.ops.tiled.plan import BLOCK_K, MIN_FREE, make_plan

from helpers import assert_close, oracle, qkv


def test_weights_with_a_structured_mask_and_a_bool_attn_mask():
    q, k, v = qkv(1, 2, 2, 6, 9, 4)
    keep = torch.rand(1, 1, 6, 9, generator=torch.Generator().manual_seed(3)) > 0.3
    kw = dict(mask=masks.sliding_window(4), attn_mask=keep)
    _, lse = attnlab.attention(q, k, v, return_lse=True, **kw)
    w = attnlab.attention_weights(q, k, lse, **kw)
    allowed = masks.sliding_window(4).to_dense(6, 9) & keep
    want = torch.softmax((q @ k.transpose(-1, -2) / 2).masked_fill(~allowed, -math.inf), -1)
    assert_close(w, torch.nan_to_num(want), atol=1e-6)
    assert bool((w.masked_fill(allowed, 0) == 0).all())


@pytest.mark.parametrize("rows", [None, [0, 3], slice(2, 6)])
def test_weights_with_a_float_mask_holding_minus_inf(rows):
    q, k, v = qkv(1, 2, 2, 6, 40, 4)
    bias = torch.randn(6, 40, generator=torch.Generator().manual_seed(4))
    bias[:, 15:] = -math.inf  # most keys dead: the weights score only the live columns
    bias[:, :3] = -math.inf
    _, lse = attnlab.attention(q, k, v, attn_mask=bias, return_lse=True)
    w = attnlab.attention_weights(q, k, lse, rows=rows, attn_mask=bias)
    want = torch.softmax(q @ k.transpose(-1, -2) / 2 + bias, -1)
    want = want[..., rows if rows is not None else slice(None), :]
    assert_close(w, want, atol=1e-6)


def test_weight_rows_empty_negative_and_bad():
    q, k, v = qkv(1, 1, 1, 5, 7, 4)
    _, lse = attnlab.attention(q, k, v, return_lse=True)
    full = attnlab.attention_weights(q, k, lse)
    assert attnlab.attention_weights(q, k, lse, rows=[]).shape == (1, 1, 0, 7)
    assert_close(attnlab.attention_weights(q, k, lse, rows=[-5, -1]), full[:, :, [0, 4]], atol=0)
    with pytest.raises(AttnlabError, match=r"rows: expected .*got \[0\.5\]"):
        attnlab.attention_weights(q, k, lse, rows=[0.5])
    with pytest.raises(AttnlabError, match="rows"):
        attnlab.attention_weights(q, k, lse, rows=[-6])
    with pytest.raises(AttnlabError, match=r"lse: expected \(\.\.\., H, L\) = \(1, 1, 5\) like "
                                           r"query \(1, 1, 5, 4\), got \(1, 1, 4\)"):
        attnlab.attention_weights(q, k, lse[..., :4])
    with pytest.raises(AttnlabError, match="got list"):
        attnlab.attention_weights(q, k, lse.tolist())


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "tiled"])
def test_five_dim_inputs_with_a_per_batch_mask(backend):
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 2, 5, 4, generator=g) for _ in range(3))
    keep = torch.rand(2, 3, 1, 5, 5, generator=g) > 0.4
    keep[..., 0] = True
    for need_lse in (False, True):  # the lse comes from a 4-D kernel: batch dims flattened
        got = attnlab.attention(q, k, v, attn_mask=keep, backend=backend, return_lse=need_lse)
        out, lse = got if need_lse else (got, None)
        refs = [oracle(q[i], k[i], v[i], allowed=keep[i]) for i in range(2)]
        assert_close(out, torch.stack([r[0] for r in refs]), atol=1e-5)
        if need_lse:
            assert_close(lse, torch.stack([r[1] for r in refs]), atol=1e-5, what="lse")


def test_gradients_through_several_fused_chunks():
    # a causal row block past MIN_FREE keys runs a free chunk and a masked one: dq adds both
    L = MIN_FREE + 130
    q, k, v = qkv(1, 1, 1, L, L, 8, dtype=torch.float64, seed=9, requires_grad=True)
    p = make_problem(q, k, v, None, 0.0, True, None, False, mask=None)
    assert max(len(c) for _, _, c in make_plan(p, fused=True).rows) >= 2
    got = torch.autograd.grad(attnlab.attention(q, k, v, is_causal=True, backend="tiled")
                              .square().sum(), (q, k, v))
    want = torch.autograd.grad(attnlab.attention(q, k, v, is_causal=True, backend="math")
                               .square().sum(), (q, k, v))
    for g, w, name in zip(got, want, "qkv"):
        assert_close(g, w, atol=1e-10, what=f"d{name}")


@pytest.mark.parametrize("backend", ["sdpa", "math", "tiled"])
def test_dropout_one_drops_everything(backend):
    q, k, v = qkv(1, 2, 2, 5, 6, 4)
    out = attnlab.attention(q, k, v, dropout_p=1.0, backend=backend, mask=masks.causal())
    assert bool((out == 0).all())


def test_reference_backend_refuses_dropout():
    q, k, v = qkv(1, 1, 1, 3, 3, 4)
    with pytest.raises(AttnlabError, match="dropout_p"):
        attnlab.attention(q, k, v, dropout_p=0.5, backend="reference")


def test_float64_pure_tiled_path_keeps_float64_accuracy():
    q, k, v = qkv(1, 2, 2, 70, 90, 16, dtype=torch.float64, seed=11)
    p = make_problem(q, k, v, None, 0.0, False, None, False, mask=masks.sliding_window(50))
    out, lse = tiled.forward(p, fused=False)
    ref, ref_lse = oracle(q, k, v, allowed=masks.sliding_window(50).to_dense(70, 90))
    assert out.dtype == lse.dtype == torch.float64
    assert_close(out, ref, atol=1e-12, what="float64 output")
    assert_close(lse, ref_lse, atol=1e-12, what="float64 lse")


def test_poison_masked_only_by_a_float_mask_next_to_a_structured_one():
    q, k, v = qkv(1, 2, 2, 6, 6, 4)
    k[..., 1, :] = float("nan")
    v[..., 1, :] = float("nan")
    bias = torch.zeros(6, 6)
    bias[:, 1] = -math.inf  # the causal mask alone would let rows >= 1 see key 1
    for backend in ["auto", "sdpa", "math", "tiled"]:
        out = attnlab.attention(q, k, v, attn_mask=bias, mask=masks.causal(), backend=backend)
        assert torch.isfinite(out).all(), backend


def _choice(L, S, **kw):
    q, k, v = qkv(1, 1, 1, L, S, 4)
    return attnlab.select_backend(q, k, v, **kw)


def test_auto_switches_at_the_documented_thresholds(monkeypatch):
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")  # the PyTorch path's rule (kernel: test_interval_*)
    # tile density exactly DENSE_ENOUGH stays tiled; one more key block goes dense
    L, S = 1024, 2048
    n = int(dispatch.DENSE_ENOUGH * S)
    assert n % BLOCK_K == 0
    assert _choice(L, S, mask=masks.padding(key_lengths=[n])).backend == "tiled"
    assert _choice(L, S, mask=masks.padding(key_lengths=[n + BLOCK_K])).backend == "sdpa"
    # a dense attn_mask alone past the small size: the fused kernel with it
    keep = torch.ones(1100, 1100, dtype=torch.bool)
    c = _choice(1100, 1100, attn_mask=keep)
    assert c.backend == "sdpa" and c.reason.startswith("a dense attn_mask only")


def test_auto_reasons_name_the_rule(monkeypatch):
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")  # the PyTorch path's rule (kernel: test_interval_*)
    q, k, v = qkv(1, 2, 2, 8, 8, 4)
    sel = attnlab.select_backend
    assert sel(q, k[..., :0, :], v[..., :0, :]).reason.startswith("empty input")
    assert "top-left causal" in sel(q, k, v, is_causal=True).reason  # "small top-left ..." at L 8
    bias = torch.zeros(8, 8, requires_grad=True)
    assert sel(q, k, v, attn_mask=bias).reason.startswith("a float attn_mask that needs a grad")


def test_memory_sizes_read_in_binary_units():
    assert budget.fmt_bytes(3 * 2**30) == "3.0 GiB"
    assert budget.fmt_bytes(1.5 * 2**20) == "1.5 MiB"
    assert budget.fmt_bytes(2048) == "2.0 KiB"
    assert budget.fmt_bytes(12) == "12 bytes"


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "tiled", "reference"])
def test_scale_reaches_every_kernel_and_its_lse(backend):
    q, k, v = qkv(1, 2, 2, 9, 11, 8)
    for kw in ({}, {"mask": masks.causal("bottom_right")}):
        out, lse = attnlab.attention(q, k, v, scale=0.3, return_lse=True, backend=backend, **kw)
        allowed = kw["mask"].to_dense(9, 11) if kw else None
        ref, ref_lse = oracle(q, k, v, allowed=allowed, scale=0.3)
        assert_close(out, ref, atol=1e-5)
        assert_close(lse, ref_lse, atol=1e-5, what="lse")


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "tiled"])
def test_one_head_with_a_strided_last_dim(backend):
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 1, 7, 16, generator=g)[..., ::2] for _ in range(3))  # stride 2
    out, lse = attnlab.attention(q, k, v, mask=masks.sliding_window(3), return_lse=True,
                                 backend=backend)
    ref, ref_lse = oracle(q, k, v, allowed=masks.sliding_window(3).to_dense(7, 7))
    assert_close(out, ref, atol=1e-5)
    assert_close(lse, ref_lse, atol=1e-5, what="lse")


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "tiled"])
def test_a_per_batch_structured_mask_over_two_batch_dims(backend):
    q, k, v = (x.reshape(2, 3, 2, 6, 4) for x in qkv(6, 2, 2, 6, 6, 4))
    mask = masks.padding(key_lengths=[6, 2, 4])  # one length per element of the last batch dim
    out = attnlab.attention(q, k, v, mask=mask, backend=backend)
    allowed = mask.to_dense(6, 6)  # (3, 1, 6, 6)
    want = torch.stack([oracle(q[i], k[i], v[i], allowed=allowed)[0] for i in range(2)])
    assert_close(out, want, atol=1e-5)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "tiled", "reference"])
def test_single_element_inputs(backend):
    q, k, v = (torch.tensor([[[[x]]]]) for x in (0.5, -1.0, 3.0))  # (1, 1, 1, 1)
    out, lse = attnlab.attention(q, k, v, return_lse=True, backend=backend)
    assert out.item() == pytest.approx(3.0) and lse.item() == pytest.approx(-0.5)


@pytest.mark.parametrize("backend", ["sdpa", "math", "tiled"])
def test_dropout_drops_the_requested_fraction(backend):
    S = 64
    q, k, _ = qkv(1, 4, 4, 64, S, 8)
    v = torch.eye(S).expand(1, 4, S, S)  # output rows are the (dropped) weights themselves
    torch.manual_seed(0)
    w = attnlab.attention(q, k, v, dropout_p=0.2, backend=backend)
    dropped = (w == 0).double().mean().item()
    assert 0.17 < dropped < 0.23, dropped


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "tiled"])
def test_attention_without_dropout_leaves_the_global_rng_alone(backend):
    q, k, v = qkv(1, 2, 2, 5, 6, 4)
    torch.manual_seed(123)
    attnlab.attention(q, k, v, mask=masks.sliding_window(2), softcap=5.0, backend=backend)
    a = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(a, torch.rand(3))
