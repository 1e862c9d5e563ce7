"""NaN/Inf in a key or value reaches exactly the rows that may attend it, on every backend.

A row that may attend a poisoned position is NaN (output and lse); every other row is exactly
what it would be with finite numbers there. Kernels that mask after the product (NaN + -inf) or
multiply zero weights by values (0 · NaN) spread the NaN over a whole tile; this must not show."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks

from helpers import assert_close, backend_names, qkv

BACKENDS = backend_names()


def nan_rows(out: torch.Tensor) -> list[int]:
    """Rows (of the last query dim) where any head/batch/feature is NaN."""
    return out.isnan().reshape(-1, out.shape[-2], out.shape[-1]).any(0).any(-1).nonzero()[:, 0] \
        .tolist()


@pytest.mark.parametrize("where", ["key", "value"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_nan_reaches_only_rows_that_see_it(backend, where):
    L = 16
    q, k, v = qkv(1, 2, 2, L, L, 8, seed=1)
    (k if where == "key" else v)[:, :, 2, 0] = float("nan")
    out, lse = attnlab.attention(q, k, v, is_causal=True, backend=backend, return_lse=True)
    assert nan_rows(out) == list(range(2, L))
    assert lse.isnan().any(0).any(0).nonzero()[:, 0].tolist() == list(range(2, L))
    clean = attnlab.attention(q, k.nan_to_num(), v.nan_to_num(), is_causal=True, backend=backend)
    assert_close(out[..., :2, :], clean[..., :2, :], atol=1e-6, what="rows 0, 1")


@pytest.mark.parametrize("backend", BACKENDS)
def test_unmasked_nan_key_makes_every_row_of_its_head_nan_lse_too(backend):
    """Without a mask every row sees the key: out and lse are NaN in that head, on every backend
    (the math path once gave lse -inf there)."""
    q, k, v = qkv(1, 2, 2, 4, 6, 16, seed=3)
    k[0, 1, 3, 5] = float("nan")
    out, lse = attnlab.attention(q, k, v, backend=backend, return_lse=True)
    assert out[0, 1].isnan().all(-1).all() and lse[0, 1].isnan().all(), lse
    assert not out[0, 0].isnan().any() and lse[0, 0].isfinite().all(), lse


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("backend", BACKENDS)
def test_window_poison_stays_in_the_window(backend, poison):
    L, W, j = 300, 8, 137  # several query rows of one tile see j, most don't
    q, k, v = qkv(2, 2, 1, L, L, 16, seed=2)
    k[1, 0, j, 3] = poison
    v[0, 0, j + 50, 5] = poison
    mask = masks.sliding_window(W)
    out, lse = attnlab.attention(q, k, v, mask=mask, backend=backend, return_lse=True,
                                 enable_gqa=True)
    hit = torch.zeros(2, 2, L, dtype=torch.bool)
    hit[1, :, j:j + W] = True
    hit[0, :, j + 50:j + 50 + W] = True
    assert torch.equal(out.isnan().any(-1), hit), nan_rows(out)
    assert torch.equal(lse.isnan(), hit)
    fine = attnlab.attention(q, k.nan_to_num(0, 0, 0), v.nan_to_num(0, 0, 0), mask=mask,
                             backend=backend, enable_gqa=True)
    assert_close(out[~hit], fine[~hit], atol=1e-6, what="rows that never see the poison")


@pytest.mark.parametrize("backend", ["auto", "tiled", "sdpa"])
def test_long_window_nan_rows_3000_to_3063(backend):
    L = 4096
    q, k, v = qkv(1, 1, 1, L, L, 8, seed=3)
    k[..., 3000, :] = float("nan")
    out = attnlab.attention(q, k, v, mask=masks.sliding_window(64), backend=backend)
    assert nan_rows(out) == list(range(3000, 3064))


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "tiled"])
def test_padding_and_dense_masks_keep_poison_local(backend):
    L, S = 130, 140
    q, k, v = qkv(2, 2, 2, L, S, 8, seed=4)
    v[:, :, 20] = float("nan")
    allowed = torch.rand(L, S, generator=torch.Generator().manual_seed(0)) < 0.5
    out = attnlab.attention(q, k, v, attn_mask=allowed, backend=backend)
    assert nan_rows(out) == allowed[:, 20].nonzero()[:, 0].tolist()
    out = attnlab.attention(q, k, v, mask=masks.padding(key_lengths=[20, 140]), backend=backend)
    assert out[0].isfinite().all() and out[1].isnan().any(-1).all()


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "tiled"])
def test_gradients_of_rows_that_never_see_poison(backend):
    L = 40
    q, k, v = qkv(1, 2, 2, L, L, 8, seed=5)
    v[:, :, 30] = float("nan")
    kq, kk, kv = (t.clone().requires_grad_() for t in (q, k, v))
    out = attnlab.attention(kq, kk, kv, is_causal=True, backend=backend)
    out[..., :30, :].sum().backward()  # rows that never attend key 30
    fq, fk, fv = (t.nan_to_num().requires_grad_() for t in (q, k, v))
    attnlab.attention(fq, fk, fv, is_causal=True, backend=backend)[..., :30, :].sum().backward()
    assert_close(kq.grad, fq.grad, atol=1e-5, what="dq")
    assert_close(kk.grad, fk.grad, atol=1e-5, what="dk")
    assert_close(kv.grad, fv.grad, atol=1e-5, what="dv")


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("L", [4, 8, 97])
@pytest.mark.parametrize("backend", BACKENDS)
def test_poisoned_query_row_is_nan_on_every_backend(backend, L, poison):
    """A query row holding NaN/Inf is NaN (out and lse) when it may attend anything; the fused
    CPU kernel alone returns it as 0 with lse 0 (causal, L = 4)."""
    q, k, v = qkv(1, 2, 2, L, L, 8, seed=3)
    q[0, 0, L - 1, 1] = poison
    out, lse = attnlab.attention(q, k, v, is_causal=True, backend=backend, return_lse=True)
    assert bool(out[0, 0, L - 1].isnan().all()) and bool(lse[0, 0, L - 1].isnan())
    assert int(out.isnan().any(-1).sum()) == 1 and int(lse.isnan().sum()) == 1
    q2 = q.clone()
    q2[0, 0, L - 1] = 0.0
    clean = attnlab.attention(q2, k, v, is_causal=True, backend=backend)
    assert_close(out[0, 1], clean[0, 1], atol=1e-6, what="other head")


@pytest.mark.parametrize("backend", BACKENDS)
def test_poisoned_query_row_with_nothing_to_attend_stays_zero(backend):
    L = 12
    q, k, v = qkv(1, 2, 2, L, L, 8, seed=4)
    q[0, :, L - 1, 0] = float("nan")  # padded away: attends nothing
    mask = masks.padding(key_lengths=[L], query_lengths=[L - 2])
    out, lse = attnlab.attention(q, k, v, mask=mask, backend=backend, return_lse=True)
    assert bool((out[0, :, L - 1] == 0).all()) and bool(torch.isneginf(lse[0, :, L - 1]).all())
    assert bool(torch.isfinite(out).all())
