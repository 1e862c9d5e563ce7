"""The decode step path (`ops/decode_steps.py`): a decoding loop whose cache grows every step
keeps one plan, not one per cache length, and each step gives the full path's answer, its
errors and its NaN/Inf rules; a plan holds no input and follows the kernel's switch."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks
from attnlab.ops import cheap, decode_steps, kernels

from helpers import spy_backends

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the compiled kernel")

S0 = 256  # decode.MIN_KEYS: "auto" gives these grouped-query steps the decode kernel


@pytest.fixture(autouse=True)
def _fresh():
    cheap.clear()
    decode_steps.clear()
    yield
    cheap.clear()
    decode_steps.clear()


def _cache(n=S0 + 8, dtype=torch.float32, seed=0, B=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 4, 1, 16, generator=g).to(dtype)  # 4 query heads on 2 kv heads
    k, v = (torch.randn(B, 2, n, 16, generator=g).to(dtype) for _ in range(2))
    return q, k, v


def _full(q, k, v, **kw):
    """The full path's answer: no plan kept, none used."""
    cheap.clear()
    decode_steps.clear()
    try:
        return attnlab.attention(q, k, v, enable_gqa=True, **kw)
    finally:
        cheap.clear()
        decode_steps.clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kw", [{}, {"mask": masks.causal("bottom_right")}, {"softcap": 3.0},
                                {"mask": masks.sliding_window(64, "bottom_right")},
                                {"return_lse": True}])
def test_a_growing_cache_keeps_one_plan_and_gives_the_full_paths_answer(kw, dtype):
    q, k, v = _cache(dtype=dtype)
    lengths = range(S0, S0 + 5)  # a slice of a preallocated cache, one key more each step
    want = [_full(q, k[:, :, :n], v[:, :, :n], **kw) for n in lengths]
    kept = []
    for n, w in zip(lengths, want):
        got = attnlab.attention(q, k[:, :, :n], v[:, :, :n], enable_gqa=True, **kw)
        kept.append(len(decode_steps._PLANS))
        for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, w))):
            assert torch.equal(a, b)
    assert kept == [1] * 5 and len(cheap._PLANS) == 0


def test_a_cache_grown_by_cat_and_a_broadcast_batch_take_the_plan(monkeypatch):
    q, k, v = _cache(B=3)
    k1, v1 = k[:1], v[:1]  # one key/value batch element serves every query's
    caches = [(k1[:, :, :n].clone(), v1[:, :, :n].clone()) for n in range(S0, S0 + 4)]
    want = [_full(q, kc, vc) for kc, vc in caches]
    ran = spy_backends(monkeypatch)
    kc, vc = caches[0]
    for j, w in zip(range(S0, S0 + 4), want):
        if j > S0:  # one key more, appended
            kc, vc = torch.cat([kc, k1[:, :, j - 1:j]], 2), torch.cat([vc, v1[:, :, j - 1:j]], 2)
        assert torch.equal(attnlab.attention(q, kc, vc, enable_gqa=True), w)
    assert ran == ["decode"] * 4 and len(decode_steps._PLANS) == 1


def test_a_step_auto_does_not_give_the_decode_kernel_takes_the_full_path(monkeypatch):
    q, k, v = _cache()
    attnlab.attention(q, k[:, :, :S0], v[:, :, :S0], enable_gqa=True)  # the plan
    ran = spy_backends(monkeypatch)
    got = attnlab.attention(q, k[:, :, :40], v[:, :, :40], enable_gqa=True)  # < MIN_KEYS
    assert "decode" not in ran
    assert torch.equal(got, _full(q, k[:, :, :40], v[:, :, :40]))


@pytest.mark.parametrize("masked", [True, False])
def test_errors_at_a_new_length_are_the_full_paths(masked):
    q, k, v = _cache()
    m = masks.window(left=100, right=0, align="bottom_right", key_lengths=[S0]) if masked \
        else None
    # k, v lengths differ; key_lengths > S
    for kn, vn in ((S0 + 1, S0 + 2), (S0 - 1, S0 - 1))[:2 if masked else 1]:
        attnlab.attention(q, k[:, :, :S0], v[:, :, :S0], enable_gqa=True, mask=m)  # the plan
        with pytest.raises(AttnlabError) as got:
            attnlab.attention(q, k[:, :, :kn], v[:, :, :vn], enable_gqa=True, mask=m)
        assert len(decode_steps._PLANS) == 1
        with pytest.raises(AttnlabError) as want:
            _full(q, k[:, :, :kn], v[:, :, :vn], mask=m)
        assert str(got.value) == str(want.value)


@pytest.mark.parametrize("m", [masks.causal("bottom_right"), None])
@pytest.mark.parametrize("where", ["query", "key", "value"])
def test_nonfinite_inputs_on_a_plan_follow_the_rules(where, m):
    q, k, v = _cache()
    attnlab.attention(q, k[:, :, :S0], v[:, :, :S0], enable_gqa=True, mask=m)  # the plan
    x = {"query": q, "key": k, "value": v}[where]
    x[0, 1, 0, 3] = float("nan")
    n = S0 + 3
    got = attnlab.attention(q, k[:, :, :n], v[:, :, :n], enable_gqa=True, mask=m)
    want = _full(q, k[:, :, :n], v[:, :, :n], mask=m)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and bool(torch.isnan(got).any())
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))


def test_a_plan_holds_no_input_and_follows_the_kernel_switch(monkeypatch):
    q, k, v = _cache()
    attnlab.attention(q, k[:, :, :S0], v[:, :, :S0], enable_gqa=True)
    ref = weakref.ref(k)
    del k, v
    gc.collect()
    assert ref() is None and len(decode_steps._PLANS) == 1
    q, k, v = _cache(seed=1)
    ran = spy_backends(monkeypatch)
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")
    got = attnlab.attention(q, k, v, enable_gqa=True)
    assert ran and "decode" not in ran
    assert (got - _full(q, k, v)).abs().max().item() < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kw", [{}, {"softcap": 3.0}, {"return_lse": True}, {"scale": -0.3}])
def test_a_step_without_a_mask_is_the_kernels_op_alone(kw, dtype, monkeypatch):
    """A plan without a mask serves a step with one call of the kernel's op: no Problem, no
    backend (`decode_steps._lean`), the full path's answer bit for bit."""
    q, k, v = _cache(dtype=dtype)
    lengths = (S0 + 1, S0 + 7)
    want = [_full(q, k[:, :, :n], v[:, :, :n], **kw) for n in lengths]
    attnlab.attention(q, k[:, :, :S0], v[:, :, :S0], enable_gqa=True, **kw)  # the plan
    (step,) = decode_steps._PLANS.values()
    assert step.lean is not None and step.lean[0] is not None  # the op's C step
    ran = spy_backends(monkeypatch)
    monkeypatch.setattr(decode_steps, "_problem", None)  # a step builds no Problem
    got = [attnlab.attention(q, k[:, :, :n], v[:, :, :n], enable_gqa=True, **kw)
           for n in lengths]
    assert ran == [] and len(decode_steps._PLANS) == 1
    for g, w in zip(got, want):
        for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (g, w))):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_one_head_per_kv_head_step_takes_the_kernel_from_autos_bytes_on(dtype, monkeypatch):
    """A plain one-head-per-kv-head cache is "auto"'s decode kernel's from MHA_MIN_KEYS on
    (SDPA's below): a plan kept at or above it serves the steps above it with the op alone and
    leaves those below it to the full path, which gives them SDPA."""
    from attnlab.ops.kernels import decode

    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 1, 16, generator=g).to(dtype)  # 2 query heads on 2 kv heads
    k, v = (torch.randn(1, 2, S0 + 64, 16, generator=g).to(dtype) for _ in range(2))
    least = S0 + 20
    monkeypatch.setattr(decode, "MHA_MIN_KEYS", least)
    assert attnlab.select_backend(q, k[:, :, :least - 1], v[:, :, :least - 1]).backend == "sdpa"
    assert attnlab.select_backend(q, k[:, :, :least], v[:, :, :least]).backend == "decode"
    lengths = (least, least + 1, least + 30, least - 1, least + 2)
    want = [_full(q, k[:, :, :n], v[:, :, :n]) for n in lengths]
    ran = spy_backends(monkeypatch)
    got = []
    for n in lengths:
        got.append(attnlab.attention(q, k[:, :, :n], v[:, :, :n]))
        if n == least:  # the first step keeps the plan
            (step,) = decode_steps._PLANS.values()
            assert step.lean is not None and step.lean[4] == least
    assert ran == ["decode", "sdpa"]  # the plan's first step; the one below `least`
    assert len(decode_steps._PLANS) == 1
    for g_, w in zip(got, want):
        assert g_.dtype == w.dtype and torch.equal(g_, w)


def _no_lean(q, k, v, **kw):
    """The plan kept for this call serves its steps through a Problem, not the op alone."""
    attnlab.attention(q, k, v, enable_gqa=True, **kw)
    (step,) = decode_steps._PLANS.values()
    return step.lean is None


def test_what_a_step_without_a_mask_may_not_skip_keeps_the_full_step():
    q, k, v = _cache(B=2)  # (a broadcast key/value batch: the cat test's steps)
    assert _no_lean(torch.stack([q, q], -1)[..., 0], k, v)  # a strided query
    decode_steps.clear()
    # a mask, even one that leaves one row every key (its Problem has none at this S)
    assert _no_lean(q[:, :, :1], k, v, mask=masks.causal("bottom_right"))
    decode_steps.clear()
    assert _no_lean(q, k, v, mask=masks.window(left=2 * S0 + 8, right=None,
                                               align="bottom_right"))
    decode_steps.clear()
    assert _no_lean(q[0], k[0], v[0])  # 3-D
    decode_steps.clear()
    assert _no_lean(q.requires_grad_(), k, v)  # a gradient: the interval kernel's


def test_a_step_whose_cache_is_strided_along_d_gives_the_full_paths_answer():
    """The signature holds the key's shape without its strides: a step whose key has no unit
    stride along D (not the op's to read) takes the Problem's path, which makes it one."""
    q, k, v = _cache()
    attnlab.attention(q, k[:, :, :S0], v[:, :, :S0], enable_gqa=True)  # the plan
    wide = torch.randn(1, 2, S0 + 2, 32, generator=torch.Generator().manual_seed(3))
    ks = wide[..., ::2]  # (1, 2, S0 + 2, 16), stride 2 along D
    got = attnlab.attention(q, ks, v[:, :, :S0 + 2], enable_gqa=True)
    assert len(decode_steps._PLANS) == 1
    assert torch.equal(got, _full(q, ks, v[:, :, :S0 + 2]))


def test_a_mask_that_leaves_every_key_at_the_plans_length_applies_at_the_next():
    """A window reaching further than twice the plan's cache drops out of its Problem (every key
    attended); a step whose cache outgrows it must still apply it."""
    q, k, v = _cache(n=3 * S0)
    m = masks.window(left=2 * S0 + 8, right=None, align="bottom_right")
    attnlab.attention(q, k[:, :, :S0], v[:, :, :S0], enable_gqa=True, mask=m)  # the plan
    n = 3 * S0
    got = attnlab.attention(q, k[:, :, :n], v[:, :, :n], enable_gqa=True, mask=m)
    assert len(decode_steps._PLANS) == 1
    want = _full(q, k[:, :, :n], v[:, :, :n], mask=m)
    assert torch.equal(got, want)
    assert not torch.equal(got, _full(q, k[:, :, :n], v[:, :, :n]))  # the window bites


@pytest.mark.parametrize("layout", ["sparse", "mkldnn"])
def test_a_tensor_without_strides_while_a_plan_is_kept_gets_the_full_paths_error(layout):
    """`attention` asks the step plans before the cheap path's probe (which turns such tensors
    away): a tensor without strides gets what it got without any plan."""
    q, k, v = _cache()
    x = q.to_sparse() if layout == "sparse" else q.to_mkldnn()
    with pytest.raises(Exception) as want:
        _full(x, k, v)
    attnlab.attention(q, k, v, enable_gqa=True)  # the plan
    assert decode_steps.kept()
    with pytest.raises(Exception) as got:
        attnlab.attention(x, k, v, enable_gqa=True)
    assert type(got.value) is type(want.value) and str(got.value) == str(want.value)


def test_a_step_is_asked_before_the_probe(monkeypatch):
    """With a step plan kept, a step of it makes no probe call (its S-free signature decides)."""
    q, k, v = _cache()
    attnlab.attention(q, k[:, :, :S0], v[:, :, :S0], enable_gqa=True)  # the plan
    monkeypatch.setattr(cheap, "find", None)  # a step must not reach the cheap path
    got = attnlab.attention(q, k[:, :, :S0 + 3], v[:, :, :S0 + 3], enable_gqa=True)
    monkeypatch.undo()
    assert torch.equal(got, _full(q, k[:, :, :S0 + 3], v[:, :, :S0 + 3]))


def test_a_step_under_a_mode_or_transform_calls_the_op():
    """The C step is the kernel's alone: under a dispatch mode, a torch function mode or vmap it
    declines, and a step calls the op through torch.ops as before, with the same answer."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    class Plain(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    q, k, v = _cache()
    attnlab.attention(q, k[:, :, :S0], v[:, :, :S0], enable_gqa=True)  # the plan
    n = S0 + 2
    want = attnlab.attention(q, k[:, :, :n], v[:, :, :n], enable_gqa=True)
    with Seen() as seen:
        got = attnlab.attention(q, k[:, :, :n], v[:, :, :n], enable_gqa=True)
    assert torch.equal(got, want) and seen.ops  # (the op's own allocations seen)
    with Plain():
        assert torch.equal(attnlab.attention(q, k[:, :, :n], v[:, :, :n], enable_gqa=True), want)
    (step,) = decode_steps._PLANS.values()
    fast = step.lean[0]
    assert fast(q, k[:, :, :n], v[:, :, :n], step.lean[2], step.lean[3], S0)[0].equal(want)
    with Seen():
        assert fast(q, k[:, :, :n], v[:, :, :n], step.lean[2], step.lean[3], S0) is None
    with Plain():
        assert fast(q, k[:, :, :n], v[:, :, :n], step.lean[2], step.lean[3], S0) is None
    under_vmap = []

    def f(x):
        under_vmap.append(fast(x, k[:, :, :n], v[:, :, :n], step.lean[2], step.lean[3], S0))
        return x

    torch.vmap(f)(torch.stack([q, q]))
    assert under_vmap == [None]


def test_the_signature_read_in_c_holds_all_but_the_cache_length():
    """`decode.key_entry`'s key: the same at every cache length and key/value strides; another
    for any other size, a query stride, a dtype, requires_grad or the grad mode; False for more
    query rows than a decode step has; None where Python's signature decides (vmap, no
    strides)."""
    from attnlab.ops.kernels import decode

    q, k, v = _cache(n=S0 + 8)
    attnlab.attention(q, k, v, enable_gqa=True)  # the build loaded
    key = decode.key_entry()
    assert key is not None
    base = key(q, k[:, :, :S0], v[:, :, :S0], 16)
    assert type(base) is bytes
    assert key(q, k, v[:, :, :S0 + 3], 16) == base  # lengths (even unequal: `find` checks)
    assert key(q, k.transpose(1, 2).contiguous().transpose(1, 2), v, 16) == base  # strides
    wide = torch.stack([q, q], -1)[..., 0]
    others = [key(wide, k, v, 16), key(q, k[..., :8], v, 16), key(q, k, v[..., :8], 16),
              key(q.double(), k, v, 16), key(q, k.double(), v, 16), key(q, k, v.double(), 16),
              key(q.clone().requires_grad_(), k, v, 16), key(q, k, v.clone().requires_grad_(), 16),
              key(q, k[:, :1], v[:, :1], 16), key(torch.cat([q, q]), k, v, 16)]
    with torch.no_grad():
        others.append(key(q, k, v, 16))
    assert all(type(o) is bytes for o in others) and len({*others, base}) == len(others) + 1
    assert key(q, k, v, 0) is False  # 1 query row > 0
    assert key(q.to_sparse(), k, v, 16) is None
    seen = []
    torch.vmap(lambda x: seen.append(key(x, k, v, 16)) or x)(torch.stack([q, q]))
    assert seen == [None]
