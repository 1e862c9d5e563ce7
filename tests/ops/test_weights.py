"""attnlab.attention_weights: exact rows of the attention matrix from the saved lse."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks, reference
from attnlab.errors import AttnlabError

from helpers import assert_close, qkv


def full_weights(q, k, allowed=None):
    s = reference.steps(q.double().numpy(), k.double().numpy(), k.double().numpy(),
                        mask=None if allowed is None else allowed.numpy())
    return torch.from_numpy(s["weights"])


@pytest.mark.parametrize("rows", [None, 0, [5, 1, -1], slice(2, 9, 3), torch.tensor([7])])
def test_rows_match_the_oracle(rows):
    mask = masks.sliding_window(6) & masks.padding(query_lengths=[12, 4])
    q, k, v = qkv(2, 4, 2, 12, 12, 8, seed=1)
    _, lse = attnlab.attention(q, k, v, mask=mask, enable_gqa=True, return_lse=True,
                               backend="tiled")
    w = attnlab.attention_weights(q, k, lse, rows=rows, mask=mask, enable_gqa=True)
    ref = full_weights(q, k, mask.to_dense(12, 12))
    idx = torch.arange(12)[rows] if rows is not None else torch.arange(12)
    idx = idx.reshape(-1)
    assert_close(w, ref[..., idx, :], atol=1e-6, what="weights")
    assert bool((ref[1, :, 4:].sum(-1) == 0).all())  # padded query rows: all-zero weights


def test_modifiers_and_lse_from_every_backend():
    q, k, v = qkv(1, 2, 2, 30, 40, 8, seed=2)
    kw = dict(is_causal=True, softcap=3.0, alibi_slopes=torch.tensor([0.3, 0.1]))
    for backend in ("math", "tiled"):
        _, lse = attnlab.attention(q, k, v, return_lse=True, backend=backend, **kw)
        w = attnlab.attention_weights(q, k, lse, rows=[0, 29], **kw)
        # the weights reproduce the output: out = w @ v
        out = attnlab.attention(q, k, v, backend="math", **kw)
        assert_close(w @ v, out[..., [0, 29], :], atol=1e-5, what=f"w @ v ({backend})")
        assert_close(w.sum(-1), torch.ones(1, 2, 2), atol=1e-5, what="rows sum to 1")


def test_bad_arguments():
    q, k, _ = qkv(1, 2, 2, 5, 5, 4)
    lse = torch.zeros(1, 2, 5)
    with pytest.raises(AttnlabError, match="lse: expected"):
        attnlab.attention_weights(q, k, torch.zeros(1, 2, 4))
    with pytest.raises(AttnlabError, match="rows"):
        attnlab.attention_weights(q, k, lse, rows=[7])
    with pytest.raises(AttnlabError, match="rows"):
        attnlab.attention_weights(q, k, lse, rows=1.5)


@pytest.mark.parametrize("shape", [(40, 8), (4, 40, 8), (2, 4, 40, 8)])
def test_sparse_rows_with_gqa_alibi_and_leading_dims(shape):
    g = torch.Generator().manual_seed(4)
    q = torch.randn(shape, generator=g)
    kv_shape = (*shape[:-3], 2, *shape[-2:]) if len(shape) > 2 else shape
    k, v = torch.randn(kv_shape, generator=g), torch.randn(kv_shape, generator=g)
    H = shape[-3] if len(shape) > 2 else 1
    kw = dict(mask=masks.sliding_window(5), enable_gqa=len(shape) > 2,
              alibi_slopes=torch.linspace(0.1, 0.8, H))
    out, lse = attnlab.attention(q, k, v, return_lse=True, backend="tiled", **kw)
    w = attnlab.attention_weights(q, k, lse, rows=[0, 17, 39], **kw)  # 13 of 40 keys scored
    assert_close(w @ v.repeat_interleave(2, -3) if len(shape) > 2 else w @ v,
                 out[..., [0, 17, 39], :], atol=1e-5, what="w @ v")
    assert bool((w[..., 1, :12] == 0).all()) and bool((w[..., 1, 18:] == 0).all())
