"""CausalSelfAttention: KV-cache decoding equals the full forward, causality, rotary, records."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import AttnlabError
from attnlab.nn import CausalSelfAttention, KVCache, RotaryEmbedding

from helpers import close


def module(kv_heads=4, rotary=False, seed=0, d=48, heads=4):
    torch.manual_seed(seed)
    return CausalSelfAttention(d, heads, kv_heads, rotary=rotary).eval()


@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("prefill", [1, 7])
def test_decode_token_by_token_equals_full_forward(rotary, kv_heads, prefill):
    attn = module(kv_heads, rotary)
    x = torch.randn(2, 12, 48)
    with torch.no_grad():
        full = attn(x)
        cache = attn.new_cache(2, 12)
        parts = [attn(x[:, :prefill], cache)]
        for t in range(prefill, 12):
            parts.append(attn(x[:, t:t + 1], cache))  # one-token decode
    assert cache.length == 12
    close(torch.cat(parts, dim=1), full)


def test_chunked_prefill_equals_full_forward():
    attn = module(2, rotary=True)
    x = torch.randn(1, 10, 48)
    cache = attn.new_cache(1, 16)
    with torch.no_grad():
        parts = [attn(x[:, :4], cache), attn(x[:, 4:7], cache), attn(x[:, 7:], cache)]
        close(torch.cat(parts, 1), attn(x))


def test_future_tokens_do_not_change_the_past():
    attn = module()
    x = torch.randn(1, 8, 48)
    y = x.clone()
    y[:, 5:] = torch.randn(1, 3, 48)
    with torch.no_grad():
        close(attn(x)[:, :5], attn(y)[:, :5])
        assert (attn(x)[:, 5:] - attn(y)[:, 5:]).abs().max() > 1e-4


def test_record_weights_are_causal_softmax_of_q_k():
    attn = module(2, rotary=True)
    record: list = []
    with torch.no_grad():
        attn(torch.randn(1, 6, 48), record=record)
    (r,) = record
    q = r.query[0].double().numpy()  # (H, L, D)
    k = r.key[0].double().numpy()  # (H, S, D): k/v heads recorded per query head
    s = np.einsum("hid,hjd->hij", q, k) * r.scale
    s = np.where(np.tril(np.ones((6, 6), dtype=bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(r.weights[0].double().numpy(), w, atol=1e-6)


def test_gradients_flow_through_attention():
    attn = module(2, rotary=True).train()
    x = torch.randn(2, 5, 48, requires_grad=True)
    attn(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert attn.qkv.weight.grad.abs().sum() > 0


def test_rotary_scores_depend_only_on_position_difference():
    rope = RotaryEmbedding(16)
    q, k = torch.randn(1, 16), torch.randn(1, 16)
    def score(i, j):
        return float(rope(q, torch.tensor([i])) @ rope(k, torch.tensor([j])).T)
    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)
    x = torch.randn(4, 16)  # rotation keeps the norm
    close(rope(x, torch.arange(4)).norm(dim=-1), x.norm(dim=-1))


def test_cache_errors_name_the_problem():
    attn = module(2)
    cache = attn.new_cache(1, 4)
    with torch.no_grad():
        attn(torch.randn(1, 3, 48), cache)
        with pytest.raises(AttnlabError, match="exceeds max_length 4"):
            attn(torch.randn(1, 2, 48), cache)
        with pytest.raises(AttnlabError, match=r"key: expected \(B, Hkv, L, D\)"):
            cache.update(torch.zeros(2, 2, 1, 12), torch.zeros(2, 2, 1, 12))
    with pytest.raises(AttnlabError, match="max_length"):
        KVCache(1, 2, 0, 12)
    with pytest.raises(AttnlabError, match="even head dim"):
        RotaryEmbedding(15)
    with pytest.raises(AttnlabError, match=r"x: expected \(B, L, d_model=48\)"):
        attn(torch.randn(1, 3, 40))
