"""The decode step path (`ops/decode_steps.py`): a decoding loop whose cache grows every step
keeps one plan, not one per cache length, and each step gives the full path's answer, its
errors and its NaN/Inf rules; a plan holds no input and follows the kernel's switch."""

from __future__ import annotations

import gc
import os
import weakref

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks
from attnlab.ops import cheap, decode_steps, kernels
from attnlab.ops.kernels import build, isa
from interval_cases import isa_params

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
    # a mask, even one that leaves every key at this S (its Problem has none): two rows
    assert _no_lean(torch.cat([q, q], 2), k, v, mask=masks.causal("bottom_right"))
    decode_steps.clear()
    assert _no_lean(q, k, v, mask=masks.causal())  # top-left: one key for one row
    decode_steps.clear()
    assert _no_lean(q, k, v, mask=masks.window(left=2 * S0 + 8, right=None,
                                               align="bottom_right"))
    decode_steps.clear()
    assert _no_lean(q[0], k[0], v[0])  # 3-D
    decode_steps.clear()
    assert _no_lean(q.requires_grad_(), k, v)  # a gradient: the interval kernel's


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_row_under_a_bottom_right_causal_mask_is_the_kernels_op_alone(dtype, monkeypatch):
    """A decoding step's own mask (transformers', `attnlab.nn`'s): its one row sees every key at
    every S, so its plan serves steps as one without a mask does (in C, for that mask object
    only), the full path's answer bit for bit."""
    q, k, v = _cache(dtype=dtype)
    m = masks.causal("bottom_right")
    lengths = (S0 + 1, S0 + 7)
    want = [_full(q, k[:, :, :n], v[:, :, :n], mask=m) for n in lengths]
    attnlab.attention(q, k[:, :, :S0], v[:, :, :S0], enable_gqa=True, mask=m)  # the plan
    (step,) = decode_steps._PLANS.values()
    assert step.lean is not None
    for n, w in zip(lengths, want):
        assert torch.equal(_serve(q, k[:, :, :n], v[:, :, :n], mask=m), w)
        assert _serve(q, k[:, :, :n], v[:, :, :n], mask=masks.causal("bottom_right")) is None
        assert _serve(q, k[:, :, :n], v[:, :, :n]) is None
    monkeypatch.setattr(decode_steps, "find", None)  # served in C
    assert torch.equal(attnlab.attention(q, k[:, :, :S0 + 1], v[:, :, :S0 + 1], enable_gqa=True,
                                         mask=m), want[0])


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

# The C table (csrc/decode_serve.cpp, `decode_steps.serve`): a step of a plan without a mask is
# served in one C call, bit for bit the kept build's op, and only for a call that `find` would give
# the very same plan: another switch value, scalar, mask object, grad mode or requires_grad
# misses; a mode, a transform or a row not finite hands the call back; the table holds no input
# and keeps at most its bound, the least recently served dropped.


def _serve(q, k, v, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=True, mask=None,
           softcap=None, return_lse=False):
    """The C table's answer for this call (None: not served)."""
    assert decode_steps.serve is not None  # installed by the first plan kept
    return decode_steps.serve(q, k, v, dropout_p, is_causal, scale, enable_gqa, mask, softcap,
                              return_lse)


@pytest.mark.parametrize("which", isa_params())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kw", [{}, {"softcap": 3.0}, {"return_lse": True}, {"scale": -0.3}])
def test_a_step_is_served_in_c_by_the_kept_builds_op(which, dtype, kw, monkeypatch):
    """Each ISA build's plan: later steps never reach Python's lookup, and give that build's op
    bit for bit (out, and lse with return_lse)."""
    monkeypatch.setenv("ATTNLAB_KERNEL_ISA", which)
    ops = build.load(which)
    q, k, v = _cache(n=S0 + 9, dtype=dtype)
    attnlab.attention(q, k[:, :, :S0], v[:, :, :S0], enable_gqa=True, **kw)  # the plan
    monkeypatch.setattr(decode_steps, "find", None)  # a step must not reach Python's lookup
    monkeypatch.setattr(cheap, "serve", None)
    scale = kw.get("scale", 16 ** -0.5)
    for n in (S0 + 1, S0 + 9):
        got = attnlab.attention(q, k[:, :, :n], v[:, :, :n], enable_gqa=True, **kw)
        out, lse, finite = ops.decode(q, k[:, :, :n], v[:, :, :n], None, None, None, scale,
                                      kw.get("softcap", 0.0), 0, 0, True)
        assert finite
        if kw.get("return_lse"):
            assert type(got) is tuple and torch.equal(got[0], out) and torch.equal(got[1], lse)
        else:
            assert got.dtype == dtype and torch.equal(got, out)


def _kept(**kw):
    """A plan without a mask kept (C table), and the inputs of a later step it serves."""
    q, k, v = _cache()
    attnlab.attention(q, k[:, :, :S0], v[:, :, :S0], enable_gqa=True, **kw)
    k, v = k[:, :, :S0 + 5], v[:, :, :S0 + 5]
    got = _serve(q, k, v, **kw)
    assert type(got) is torch.Tensor
    return q, k, v


@pytest.mark.parametrize("other", [
    {"scale": 0.3}, {"scale": 1}, {"softcap": 2.0}, {"return_lse": True}, {"is_causal": True},
    {"mask": masks.causal("bottom_right")}, {"dropout_p": 0.1}, {"enable_gqa": 1}])
def test_a_call_with_other_scalars_or_a_mask_object_misses(other):
    q, k, v = _kept(scale=0.25, softcap=4.0)
    base = {"scale": 0.25, "softcap": 4.0}
    assert _serve(q, k, v, **{**base, **other}) is None
    assert type(_serve(q, k, v, **base)) is torch.Tensor


def test_another_mask_object_misses_and_the_table_holds_no_input():
    """A plan keyed on a mask object is served for that object only, which it holds (its address
    stays its own); the table never holds a step's tensors."""
    q, k, v = _kept()
    refs = [weakref.ref(x) for x in (q, k, v)]
    m, other = masks.causal("bottom_right"), masks.causal("bottom_right")
    key = decode_steps._KEY[0](q, k, v, 16)
    (step,) = decode_steps._PLANS.values()
    keep = decode_steps._C[0][1]
    assert keep(key, 0.0, False, None, True, m, None, False, *isa.switches(), step.lean[0],
                *step.lean[2:5])
    assert type(_serve(q, k, v, mask=m)) is torch.Tensor
    assert _serve(q, k, v, mask=other) is None
    held = weakref.ref(m)
    del m, q, k, v
    gc.collect()
    assert held() is not None and all(r() is None for r in refs)
    decode_steps.clear()
    gc.collect()
    assert held() is None


@pytest.mark.parametrize("switch", ["ATTNLAB_KERNEL_ISA", "ATTNLAB_KERNEL"])
def test_a_switch_flip_misses(switch, monkeypatch):
    q, k, v = _kept()
    was = os.environ.get(switch)  # the value the plan was kept under (a run may set the ISA)
    flipped = "0" if switch == "ATTNLAB_KERNEL" else ("avx2" if was == "scalar" else "scalar")
    monkeypatch.setenv(switch, flipped)
    assert _serve(q, k, v) is None
    if was is None:
        monkeypatch.delenv(switch)
    else:
        monkeypatch.setenv(switch, was)
    assert type(_serve(q, k, v)) is torch.Tensor


def test_the_grad_mode_and_requires_grad_miss():
    q, k, v = _kept()
    with torch.no_grad():
        assert _serve(q, k, v) is None
        attnlab.attention(q, k, v, enable_gqa=True)  # its own plan
        assert type(_serve(q, k, v)) is torch.Tensor
    assert type(_serve(q, k, v)) is torch.Tensor
    assert _serve(q.clone().requires_grad_(), k, v) is None
    assert _serve(q, k, v.clone().requires_grad_()) is None


def test_other_shapes_strides_and_short_caches_miss_or_decline():
    q, k, v = _kept()
    assert _serve(q.double(), k, v) is None  # another signature
    assert _serve(torch.cat([q, q], 1), k, v) is None
    assert _serve(torch.stack([q, q], -1)[..., 0], k, v) is None  # a strided query
    assert _serve(q, k[:, :, :S0 - 1], v[:, :, :S0 - 1]) is None  # < MIN_KEYS: the step declines
    assert _serve(q, k, v[:, :, :-1]) is None  # lengths differ
    wide = torch.randn(1, 2, k.shape[2], 32)
    assert _serve(q, wide[..., ::2], v) is None  # no unit stride along D
    assert _serve(q.to_sparse(), k, v) is None


@pytest.mark.parametrize("where", ["query", "key", "value"])
def test_a_row_not_finite_is_handed_back(where):
    q, k, v = _kept()
    x = {"query": q, "key": k, "value": v}[where]
    x[0, 1, 0, 3] = float("nan")
    assert _serve(q, k, v) is None
    got = attnlab.attention(q, k, v, enable_gqa=True)
    decode_steps.clear()
    want = attnlab.attention(q, k, v, enable_gqa=True)  # the full path
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and bool(torch.isnan(got).any())
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))


def test_a_mode_or_transform_is_handed_back():
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Plain(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    q, k, v = _kept()
    with Seen():
        assert _serve(q, k, v) is None
    with Plain():
        assert _serve(q, k, v) is None
    seen = []
    torch.vmap(lambda x: seen.append(_serve(x, k, v)) or x)(torch.stack([q, q]))
    assert seen == [None]


def test_the_table_keeps_its_bound_dropping_the_least_recently_served():
    def install(most):
        build.c_functions("attnlab_decode_serve_entry", isa.ENV, isa.KERNEL_KEY, isa.ISA_KEY,
                          decode_steps._MAX_ROWS, most)

    steps = [_kept(scale=s) for s in (0.1, 0.2)]  # A, B (installs the table)
    try:
        install(2)
        decode_steps.clear()
        for s in (0.1, 0.2):
            _kept(scale=s)
        assert type(_serve(*steps[0], scale=0.1)) is torch.Tensor  # A served: B the oldest
        _kept(scale=0.3)  # C: one plan too many
        assert _serve(*steps[1], scale=0.2) is None
        assert type(_serve(*steps[0], scale=0.1)) is torch.Tensor
        assert type(_serve(*steps[0], scale=0.3)) is torch.Tensor
    finally:
        install(decode_steps.MAX_PLANS)
