"""API edges: odd `rows`, odd mask-constructor arguments, meta tensors, and what SDPA accepts.

Bad input is an AttnlabError naming the argument (and only arguments the caller passed); what
SDPA accepts, attnlab accepts with SDPA's answer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab import AttnlabError, masks

from helpers import assert_close

g = torch.Generator().manual_seed(0)
Q, K, V = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
K = torch.randn(2, 3, 6, 8, generator=g)
V = torch.randn(2, 3, 6, 8, generator=g)
_, LSE = attnlab.attention(Q, K, V, return_lse=True)


@pytest.mark.parametrize("rows", ["a", {1, 2}, [[1]], 1.5, True, [0.5], [1, "a"], {"a": 1}])
def test_bad_rows_named(rows):
    with pytest.raises(AttnlabError, match=r"^rows: expected an int, a slice or a 1-D sequence"):
        attnlab.attention_weights(Q, K, LSE, rows=rows)


@pytest.mark.parametrize("rows", [[], (), torch.tensor([], dtype=torch.long), slice(3, 3)])
def test_no_rows_is_an_empty_result(rows):
    w = attnlab.attention_weights(Q, K, LSE, rows=rows)
    assert w.shape == (2, 3, 0, 6)


CONSTRUCTORS = [
    ("window string", lambda: masks.sliding_window("3"), r"^size: "),
    ("window beyond int64", lambda: masks.sliding_window(10**30), r"^size: .*2\*\*63"),
    ("padding beyond int64", lambda: masks.padding([2**70]), r"^key_lengths: .*int64"),
    ("padding query beyond int64", lambda: masks.padding(query_lengths=2**64),
     r"^query_lengths: .*int64"),
    ("padding string", lambda: masks.padding("abc"), r"^key_lengths: expected integer lengths"),
    ("padding ragged", lambda: masks.padding([[1, 2], [3]]), r"^key_lengths: .*nesting"),
    ("padding nested", lambda: masks.padding([[1, 2], [3, 4]]), r"^key_lengths: .*flat"),
    ("padding floats", lambda: masks.padding([1.5]), r"^key_lengths: .*float"),
    ("prefix string", lambda: masks.prefix_lm("3"), r"^prefix_length: "),
    ("prefix beyond int64", lambda: masks.prefix_lm(2**70), r"^prefix_length: .*int64"),
    ("document string", lambda: masks.document("0011"), r"^segment_ids: "),
    ("document ragged", lambda: masks.document([[0, 1], [1]]), r"^segment_ids: .*nesting"),
    ("document beyond int64", lambda: masks.document([2**70, 1]), r"^segment_ids: .*int64"),
    ("kv document string", lambda: masks.document([0, 1], "ab"), r"^kv_segment_ids: "),
    ("to_dense negative", lambda: masks.causal().to_dense(-1, 5), r"^L: expected an int >= 0"),
    ("to_dense float", lambda: masks.causal().to_dense(4, 2.5), r"^S: expected an int >= 0"),
    ("tiles zero blocks", lambda: masks.causal().tiles(8, 8, 0, 0),
     r"^block_q: expected a positive int"),
    ("tiles zero block_k", lambda: masks.causal().tiles(8, 8, 4, 0), r"^block_k: "),
    ("to_dense wrong length", lambda: masks.document([0, 1]).to_dense(3, 2), r"^segment_ids: "),
]


@pytest.mark.parametrize("name,make,match", CONSTRUCTORS, ids=[c[0] for c in CONSTRUCTORS])
def test_mask_arguments_named(name, make, match):
    with pytest.raises(AttnlabError, match=match):
        make()


def test_numpy_ints_are_ints():
    assert masks.causal().to_dense(np.int64(3), np.int32(4)).shape == (1, 1, 3, 4)
    assert masks.padding(np.array([2, 3])).to_dense(3, 4).shape == (2, 1, 3, 4)


def test_meta_tensors_refused():
    m = torch.empty(2, 3, 5, 8, device="meta")
    with pytest.raises(AttnlabError, match=r"^query, key, value: meta tensors"):
        attnlab.attention(m, m, m)
    with pytest.raises(AttnlabError, match=r"^query, key: meta tensors"):
        attnlab.attention_weights(m, m, torch.empty(2, 3, 5, device="meta"))


def test_weights_errors_name_only_query_and_key():
    for bad_key, match in [
        (torch.randn(2, 3, 6, 4), r"^key: expected .* to match query \(2, 3, 5, 8\), got"),
        (torch.randn(2, 3, 6, 8, dtype=torch.float64), r"^query, key: expected one dtype"),
        (torch.randn(3, 6, 8), r"^query, key: expected the same number of dims"),
    ]:
        with pytest.raises(AttnlabError, match=match) as info:
            attnlab.attention_weights(Q, bad_key, LSE)
        assert "value" not in str(info.value)


BACKENDS = ["auto", "sdpa", "math", "tiled", "reference"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_key_value_batch_broadcast_like_sdpa(backend):
    k1 = torch.randn(1, 3, 6, 8, generator=g)
    v1 = torch.randn(1, 3, 6, 8, generator=g)
    want = F.scaled_dot_product_attention(Q, k1, v1, is_causal=True)
    got = attnlab.attention(Q, k1, v1, is_causal=True, backend=backend)
    assert_close(got, want, atol=1e-5)
    if backend == "reference":
        return
    q, k, v = (t.clone().requires_grad_() for t in (Q, k1, v1))
    out, lse = attnlab.attention(q, k, v, backend=backend, return_lse=True,
                                 mask=masks.sliding_window(2))
    out.sum().backward()
    q2, k2, v2 = (t.clone().requires_grad_() for t in (Q, k1, v1))
    allowed = masks.sliding_window(2).to_dense(5, 6)[0, 0]
    F.scaled_dot_product_attention(q2, k2, v2, attn_mask=allowed).sum().backward()
    for a, b in ((q, q2), (k, k2), (v, v2)):
        assert a.grad.shape == b.grad.shape
        assert_close(a.grad, b.grad, atol=1e-5)
    w = attnlab.attention_weights(Q, k1, lse.detach(), mask=masks.sliding_window(2))
    assert w.shape == (2, 3, 5, 6)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "tiled"])
def test_dropout_one_drops_everything_like_sdpa(backend):
    q, k, v = (t.clone().requires_grad_() for t in (Q, K, V))
    want = F.scaled_dot_product_attention(Q, K, V, dropout_p=1.0)
    out = attnlab.attention(q, k, v, dropout_p=1.0, backend=backend, mask=masks.causal())
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(want, torch.zeros_like(want))
    out.sum().backward()
    assert all(t.grad is not None and not t.grad.isnan().any() for t in (q, k, v))


@pytest.mark.parametrize("backend", BACKENDS)
def test_numpy_bool_is_causal(backend):
    want = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
    got = attnlab.attention(Q, K, V, is_causal=np.bool_(True), backend=backend)
    assert_close(got, want, atol=1e-5)
    got = attnlab.attention(Q, K, V, is_causal=np.bool_(False), backend=backend)
    assert_close(got, F.scaled_dot_product_attention(Q, K, V), atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_half_float_mask_with_fp32_queries_is_added_in_fp32(backend):
    """SDPA refuses a float mask of another dtype; attnlab adds it in the accumulation dtype."""
    bias = torch.randn(5, 6, generator=g).to(torch.float16)
    bias[1, 2] = float("-inf")
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(Q, K, V, attn_mask=bias)
    want = F.scaled_dot_product_attention(Q, K, V, attn_mask=bias.float())
    got = attnlab.attention(Q, K, V, attn_mask=bias, backend=backend)
    assert_close(got, want, atol=1e-5)
