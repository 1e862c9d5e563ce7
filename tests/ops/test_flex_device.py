"""The CUDA path walked on `meta` tensors, pretending the device is CUDA: what "auto" picks,
and that nothing on the way (mask tiles, the BlockMask, the NaN/Inf policy, score_mod plumbing)
is CPU-only or reads a value back to the host. A meta tensor has no data: `.item()`, `bool(t)`,
`nonzero`, boolean indexing and `.tolist()` raise on it, so any host sync fails these tests."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.ops import dispatch, flex
from attnlab.ops.validate import check_score_mod, make_problem


@pytest.fixture
def pretend_cuda(monkeypatch):
    """dispatch treats every tensor as on CUDA; the Flex kernel (which cannot run on meta) is
    replaced by a stand-in that checks its inputs and calls the score_mod on device tensors."""
    monkeypatch.setattr(dispatch, "on_device", lambda p: True)
    calls = []

    def kernel(fn, q, k, v, need_lse, *, score_mod=None, block_mask=None, scale=None,
               enable_gqa=False):
        B, H, L, _ = q.shape
        S = k.shape[2]
        calls.append({"block_mask": block_mask, "score_mod": score_mod})
        if score_mod is not None:  # FlexAttention's convention on broadcast device indices
            ar = lambda n: torch.arange(n, device=q.device)  # noqa: E731
            s = score_mod(torch.empty(B, H, L, S, device=q.device), ar(B)[:, None, None, None],
                          ar(H)[None, :, None, None], ar(L)[None, None, :, None],
                          ar(S)[None, None, None, :])
            assert s.shape == (B, H, L, S) and s.device == q.device
        if block_mask is not None:
            assert block_mask.kv_num_blocks.device == q.device
        return (torch.empty(B, H, L, v.shape[-1], dtype=q.dtype, device=q.device),
                torch.empty(B, H, L, dtype=torch.float32, device=q.device) if need_lse else None)

    monkeypatch.setattr(flex, "run_kernel", kernel)
    return calls


def meta_problem(L=1000, S=1000, H=4, Hkv=4, D=64, dtype=torch.bfloat16, grad=False, **kw):
    """A validated call whose tensors are then moved to `meta` (validation refuses meta inputs,
    which hold no values: the dispatch after it is what runs on the device)."""
    mod = kw.get("score_mod")
    q = torch.zeros(2, H, L, D, dtype=dtype)
    k, v = torch.zeros(2, Hkv, S, D, dtype=dtype), torch.zeros(2, Hkv, S, D, dtype=dtype)
    p = make_problem(q, k, v, kw.pop("attn_mask", None), kw.pop("dropout_p", 0.0),
                     kw.pop("is_causal", False), None, Hkv != H, mask=kw.pop("mask", None), **kw)
    meta = lambda t: None if t is None else t.to("meta").requires_grad_(grad)  # noqa: E731
    am = None if p.attn_mask is None else p.attn_mask.to("meta")
    return dataclasses.replace(p, query=meta(p.query), key=meta(p.key), value=meta(p.value),
                               attn_mask=am, score_mod=check_score_mod(mod, p.dims, "meta"))


DOCS = torch.arange(1000) // 300


def bucket(s, b, h, q, k):
    return s + 0.01 * (k - q).abs()


CASES = {  # name: (kwargs, the backend "auto" must pick on CUDA)
    "no_mask": ({}, "sdpa"),
    "causal": ({"is_causal": True}, "sdpa"),
    "dense_bool": ({"attn_mask": "bool"}, "sdpa"),
    "sliding": ({"mask": masks.sliding_window(256)}, "flex"),
    "causal_br_square": ({"mask": masks.causal("bottom_right")}, "sdpa"),  # = top-left here
    "causal_br_cache": ({"mask": masks.causal("bottom_right"), "L": 200}, "flex"),
    "window": ({"mask": masks.window(64, 16, "bottom_right")}, "flex"),
    "documents": ({"mask": masks.causal() & masks.document(DOCS)}, "flex"),
    "padding": ({"mask": masks.padding(key_lengths=[700, 1000], query_lengths=[1000, 300])},
                "flex"),
    "ragged": ({"mask": masks.ragged_causal([1000, 600], [1000, 800])}, "flex"),
    "block_causal": ({"mask": masks.block_causal([400, 600], [500, 500], "bottom_right")}, "flex"),
    "function": ({"mask": masks.from_function(lambda b, h, q, k: (q >= k) & (q - k < 256))},
                 "flex"),
    "function_and": ({"mask": masks.from_function(lambda b, h, q, k: (q - k) % 3 != 1)
                      & masks.causal()}, "flex"),
    "score_mod": ({"score_mod": bucket}, "flex"),
    "alibi_mod": ({"score_mod": masks.alibi(torch.ones(4), symmetric=True)}, "flex"),
    "softcap": ({"softcap": 30.0, "is_causal": True}, "flex"),
    "lse": ({"return_lse": True, "is_causal": True}, "flex"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_auto_on_cuda_picks_and_runs_without_host_sync(pretend_cuda, name):
    kw, want = CASES[name]
    kw = dict(kw)
    need_lse = kw.pop("return_lse", False)
    if kw.get("attn_mask") == "bool":
        kw["attn_mask"] = torch.ones(1000, 1000, dtype=torch.bool)
    p = meta_problem(**kw)
    choice = dispatch.choose(p, need_lse)
    assert choice.backend == want, choice
    out, lse = dispatch.run("auto", p, need_lse)
    assert out.shape == p.query.shape and out.device.type == "meta"
    assert (lse is not None) == need_lse
    if want == "flex":
        assert len(pretend_cuda) == 1


def test_dropout_with_a_structured_mask_is_not_sent_to_flex(pretend_cuda):
    c = dispatch.choose(meta_problem(mask=masks.sliding_window(64), dropout_p=0.1), False)
    assert c.backend == "math" and "dropout" in c.reason


def test_float64_with_a_structured_mask_goes_to_math(pretend_cuda):
    c = dispatch.choose(meta_problem(mask=masks.sliding_window(64), dtype=torch.float64), False)
    assert c.backend == "math" and "float64" in c.reason
    c = dispatch.choose(meta_problem(is_causal=True, dtype=torch.float64), False)
    assert c.backend == "sdpa"


def test_on_device_is_the_cuda_check():
    assert not dispatch.on_device(make_problem(*(torch.zeros(1, 1, 2, 2) for _ in range(3)),
                                               None, 0.0, False, None, False, mask=None))


def test_the_nan_policy_on_device_matches_the_cpu_rule():
    """nonfinite_device gives the CPU policy's answer (rows that may attend poison are NaN, the
    rest clean), here checked on real CPU tensors through the device code path."""
    from attnlab.ops import nonfinite_device, plain
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 50, 8, generator=g, dtype=torch.float64) for _ in range(3))
    k[0, 1, 17, 3] = float("nan")
    v[1, 0, 40, 0] = float("inf")
    for m in (masks.sliding_window(5), masks.window(3, 2, "bottom_right"),
              masks.from_function(lambda b, h, qi, ki: (qi - ki) % 4 == 0),
              masks.causal() & masks.padding(key_lengths=[30, 50])):
        want = attnlab.attention(q, k, v, mask=m, backend="math")
        p = make_problem(q, k, v, None, 0.0, False, None, False, mask=m)
        p2, bad = nonfinite_device.clean(p)
        out, lse = plain.forward(p2)
        out, _ = nonfinite_device.poison(p2, bad, out, lse)
        assert torch.equal(out.isnan(), want.isnan()), m
        ok = ~want.isnan()
        assert (out[ok] - want[ok]).abs().max() < 1e-12


def test_block_mask_is_the_tile_classes():
    """The BlockMask handed to Flex is exactly the mask's own tiles at Flex's block size."""
    from attnlab.masks import EMPTY, FULL
    m = masks.window(200, 30, "bottom_right") & masks.padding(key_lengths=[900])
    bm = flex.block_mask(m, 700, 1000, "cpu")
    t = m.tiles(700, 1000, flex.BLOCK, flex.BLOCK)[0, 0]
    dense = bm.to_dense()[0, 0].bool()  # (nQ, nK): blocks visited
    assert torch.equal(dense, t != EMPTY)
    full = torch.zeros_like(dense)
    n, idx = bm.full_kv_num_blocks[0, 0], bm.full_kv_indices[0, 0]
    for r in range(full.shape[0]):
        full[r, idx[r, :n[r]].long()] = True
    assert torch.equal(full, t == FULL)
    assert flex.block_mask(m, 700, 1000, "cpu") is bm  # cached per mask and shape
