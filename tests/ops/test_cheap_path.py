"""The cheap path (`ops/cheap.py`): a call whose signature was seen before skips validation and
the choice, with the same results, the same NaN/Inf rules and the same errors as the full path;
a plan is never served for another mask object, another kernel switch, or held inputs."""

from __future__ import annotations

import gc
import math
import os
import weakref

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks
from attnlab.ops import cheap

from helpers import spy_backends


@pytest.fixture(autouse=True)
def _fresh():
    cheap.clear()
    yield
    cheap.clear()


def _qkv(L=4, S=4, H=2, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, H, n, D, generator=g) for n in (L, S, S)]


@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"mask": masks.causal("bottom_right")},
                                {"softcap": 5.0}, {"return_lse": True}])
def test_a_seen_signature_gives_the_full_paths_answer(kw):
    for seed in range(3):  # first call plans, the next ones take the plan with new values
        q, k, v = _qkv(seed=seed)
        got = attnlab.attention(q, k, v, **kw)
        want = attnlab.attention(q, k, v, backend="math", **kw)
        for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want))):
            assert (a - b).abs().max().item() < 1e-5
    assert len(cheap._PLANS) == 1


@pytest.mark.parametrize("kernel", ["1", "0"])  # the probe's verdict; Python's checks
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("where", ["query", "key", "value"])
def test_nonfinite_inputs_on_a_plan_follow_the_rules(causal, where, kernel, monkeypatch):
    monkeypatch.setenv("ATTNLAB_KERNEL", kernel)
    q, k, v = _qkv(L=4, S=4)
    attnlab.attention(q, k, v, is_causal=causal)  # the plan
    x = {"query": q, "key": k, "value": v}[where]
    x[0, 1, 2, 3] = float("nan")
    got = attnlab.attention(q, k, v, is_causal=causal)
    cheap.clear()
    want = attnlab.attention(q, k, v, is_causal=causal)  # the full path
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))
    if causal and where != "query":
        assert not torch.isnan(got[0, 1, :2]).any()  # rows before the poisoned key stay clean


def test_another_mask_object_is_another_plan():
    q, k, v = _qkv(L=1, S=6)
    a = attnlab.attention(q, k, v, mask=masks.padding(key_lengths=torch.tensor([6])))
    b = attnlab.attention(q, k, v, mask=masks.padding(key_lengths=torch.tensor([2])))
    want = attnlab.attention(q, k[:, :, :2], v[:, :, :2], backend="math")
    assert (b - want).abs().max().item() < 1e-6 and (a - b).abs().max().item() > 1e-3
    assert len(cheap._PLANS) == 2


def test_a_mask_built_from_a_tensor_does_not_follow_later_writes_to_it():
    q, k, v = _qkv(L=1, S=6)
    lengths = torch.tensor([2])
    m = masks.padding(key_lengths=lengths)
    first = attnlab.attention(q, k, v, mask=m)
    lengths[0] = 6  # the mask copied what it was given: neither the mask nor the plan change
    again = attnlab.attention(q, k, v, mask=m)
    assert torch.equal(first, again)
    want = attnlab.attention(q, k[:, :, :2], v[:, :, :2], backend="math")
    assert (again - want).abs().max().item() < 1e-6


def test_the_kernel_switch_is_part_of_the_signature(monkeypatch):
    q, k, v = _qkv(L=300, S=300)
    m = masks.sliding_window(8)
    attnlab.attention(q, k, v, mask=m)
    used = spy_backends(monkeypatch)
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")
    attnlab.attention(q, k, v, mask=m)
    assert used and "interval" not in used and "decode" not in used


def test_errors_are_the_full_paths_and_nothing_is_kept_for_them():
    q, k, v = _qkv()
    for _ in range(2):
        with pytest.raises(AttnlabError, match="key"):
            attnlab.attention(q, k[..., :5], v)
    with pytest.raises(AttnlabError):
        attnlab.attention(q, k, v, scale=float("nan"))
    assert len(cheap._PLANS) == 0


def test_a_plan_holds_no_input():
    q, k, v = _qkv()
    attnlab.attention(q, k, v)
    ref = weakref.ref(q)
    del q
    gc.collect()
    assert ref() is None


def _grads(fn, q, k, v, g):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), g))


@pytest.mark.parametrize("causal", [False, True])
def test_a_plan_with_a_gradient_runs_the_lean_flash_function_with_sdpas_gradients(causal):
    from attnlab.ops import sdpa

    q, k, v = _qkv(L=5, S=5)
    g = torch.randn(1, 2, 5, 8)
    for _ in range(2):  # the full path, then the plan
        got = _grads(lambda a, b, c: attnlab.attention(a, b, c, is_causal=causal), q, k, v, g)
    plan = next(iter(cheap._PLANS.values()))
    assert plan.sdpa[0] is sdpa.flash and plan.backend == "sdpa"
    assert "small top-left causal" in attnlab.select_backend(
        *(x.requires_grad_() for x in _qkv(L=5, S=5)), is_causal=True).reason
    want = _grads(lambda a, b, c: attnlab.attention(a, b, c, is_causal=causal, backend="math"),
                  q, k, v, g)
    for a, b in zip(got, want):
        assert (a - b).abs().max().item() < 1e-5


@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_a_plan_with_a_gradient_differentiates_twice(causal, gqa):
    q, k, v = (x.double().requires_grad_() for x in _qkv(L=3, S=3, H=2, D=4))
    if gqa:  # both query heads on one key/value head
        k, v = (x.detach()[:, :1].clone().requires_grad_() for x in (k, v))
    attnlab.attention(q, k, v, is_causal=causal, enable_gqa=gqa)  # the plan

    def fn(backend):
        def f(a, b, c):
            return attnlab.attention(a, b, c, is_causal=causal, backend=backend, enable_gqa=gqa)
        return f

    assert torch.autograd.gradcheck(fn("auto"), (q, k, v))
    assert torch.autograd.gradgradcheck(fn("auto"), (q, k, v))
    assert len(cheap._PLANS) == 1


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("where", ["query", "key", "value"])
def test_nonfinite_inputs_on_a_plan_with_a_gradient_follow_the_rules(causal, where):
    q, k, v = _qkv(L=4, S=4)
    g = torch.randn(1, 2, 4, 8)
    _grads(lambda a, b, c: attnlab.attention(a, b, c, is_causal=causal), q, k, v, g)  # plan
    {"query": q, "key": k, "value": v}[where][0, 1, 2, 3] = float("inf")
    got = _grads(lambda a, b, c: attnlab.attention(a, b, c, is_causal=causal), q, k, v, g)
    cheap.clear()
    want = _grads(lambda a, b, c: attnlab.attention(a, b, c, is_causal=causal), q, k, v, g)
    for a, b in zip(got, want):
        assert torch.equal(torch.isnan(a), torch.isnan(b))
        assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))


@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpas_own_node_gives_second_order_gradients_through_its_hook(causal, gqa):
    from attnlab.ops import sdpa

    q, k, v = (x.requires_grad_() for x in _qkv(L=4, S=4, H=4))
    if gqa:  # two query heads per key/value head
        k, v = (x.detach()[:, :2].clone().requires_grad_() for x in (k, v))
    g = torch.randn(1, 4, 4, 8)
    kw = {"is_causal": causal, "enable_gqa": gqa}
    attnlab.attention(q, k, v, **kw)  # the plan
    out = attnlab.attention(q, k, v, **kw)
    assert type(out.grad_fn).__name__ == sdpa._NODE  # SDPA's node, no Function around it
    ref = attnlab.attention(q, k, v, backend="math", **kw)
    for _ in range(2):  # a kept graph differentiated twice: the hook's grads each time
        got = torch.autograd.grad(out, (q, k, v), g, create_graph=True, retain_graph=True)
        want = torch.autograd.grad(ref, (q, k, v), g, create_graph=True, retain_graph=True)
        second = torch.autograd.grad(sum((x * x).sum() for x in got), (q, k, v),
                                     retain_graph=True)
        second_want = torch.autograd.grad(sum((x * x).sum() for x in want), (q, k, v),
                                          retain_graph=True)
        for a, b in zip((*got, *second), (*want, *second_want)):
            assert (a - b).abs().max().item() < 1e-4


def _probe():
    from attnlab.ops import kernels
    from attnlab.ops.kernels import build

    if not kernels.available():
        pytest.skip("the kernel is not available here")
    return build.get().probe


def test_the_probe_states_the_layout_and_whether_the_checked_inputs_are_finite():
    op = _probe()

    def probe(q, k, v, check, most=cheap.PRE_MAX):  # check: 0 none, 1 q, 2 q, k and v
        return op(q, k, v, (0, -most, most)[check])

    q, k, v = _qkv(L=3, S=5)
    sig = probe(q, k, v, 2)
    assert sig.endswith("F") and probe(q, k, v, 0).endswith("U")
    assert probe(*(x + 1 for x in (q, k, v)), 2) == sig  # the same layout, other values
    for other in (torch.randn(1, 2, 3, 8).transpose(-1, -2).contiguous().transpose(-1, -2),
                  q.double(), q.clone().requires_grad_(), torch.randn(1, 2, 3, 16)[..., :8]):
        assert probe(other, k, v, 2)[:-1] != sig[:-1]  # strides, dtype, requires_grad, strides
    with torch.no_grad():
        assert probe(q, k, v, 2)[:-1] != sig[:-1]  # the grad mode
    k[0, 1, 4, 7] = float("nan")  # keys are checked only when asked
    assert probe(q, k, v, 1).endswith("F") and probe(q, k, v, 2).endswith("N")
    rows = torch.randn(1, 6, 2, 8).transpose(1, 2)  # (1, 2, 6, 8) of unit-stride rows
    assert not rows.is_contiguous() and probe(rows, k, v, 1).endswith("F")
    rows[0, 1, 5, 0] = float("inf")  # the last row: every row read where it lies
    assert probe(rows, k, v, 1).endswith("N")
    assert probe(rows.transpose(-1, -2), k, v, 1).endswith("U")  # rows not of unit stride
    view = torch.randn(1, 3, 2, 8).transpose(1, 2)  # a projection's (B, L, H, D) as (B, H, L, D)
    assert probe(view, k, v, 1).endswith("F")
    view[0, 1, 2, 7] = float("nan")  # the last value in memory
    assert probe(view, k, v, 1).endswith("N")
    assert probe(q.double(), k, v, 1).endswith("U")
    assert probe(q, k, v, 1, most=q.numel() - 1).endswith("U")  # more floats than it may read
    assert probe(q.to_sparse(), k, v, 1) == ""  # no plain layout: no plan


def test_a_plan_under_the_probes_finite_verdict_runs_sdpa_with_no_other_check():
    _probe()
    q, k, v = _qkv(L=4, S=4)
    attnlab.attention(q, k, v, is_causal=True)  # the plan
    (sig, plan), = cheap._PLANS.items()
    assert sig[0].endswith("F") and plan.sdpa is not None

    def unexpected(x):
        raise AssertionError("the probe checked these inputs already")

    plan.finite = unexpected
    want = attnlab.attention(q, k, v, is_causal=True, backend="math")
    assert (attnlab.attention(q, k, v, is_causal=True) - want).abs().max().item() < 1e-5
    k[0, 0, 3, 0] = float("nan")  # another verdict: another signature, the full path's rules
    got = attnlab.attention(q, k, v, is_causal=True)
    assert torch.isnan(got[0, 0, 3]).all() and not torch.isnan(got[0, 0, :3]).any()
    assert not torch.isnan(got[0, 1]).any()


def test_a_poisoned_call_keeps_a_plan_that_takes_the_full_path():
    _probe()
    q, k, v = _qkv(L=4, S=4)
    v[0, 1, 2, 0] = float("inf")
    want = attnlab.attention(q, k, v, is_causal=True, backend="math")
    for _ in range(2):  # the full path, then its plan
        got = attnlab.attention(q, k, v, is_causal=True)
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        assert (torch.nan_to_num(got) - torch.nan_to_num(want)).abs().max().item() < 1e-5
    (sig, plan), = cheap._PLANS.items()
    assert sig[0].endswith("N") and plan.sdpa is None and plan.call is None


def test_without_the_probe_the_signature_is_pythons_until_the_kernel_is_loaded():
    _probe()
    q, k, v = _qkv()
    kernel = cheap._ENV.get(cheap._KERNEL)
    cheap._PROBES[kernel] = None  # as where the kernel was not loaded yet
    attnlab.attention(q, k, v)
    (sig, plan), = cheap._PLANS.items()
    assert type(sig[0]) is not str and plan.call is not None  # checks in Python
    assert kernel not in cheap._PROBES  # loaded now: the next call asks the probe
    attnlab.attention(q, k, v)
    assert len(cheap._PLANS) == 2 and type(list(cheap._PLANS)[-1][0]) is str


@pytest.mark.parametrize("causal", [False, True])
def test_inputs_over_pre_max_are_checked_one_by_one_after_sdpas_kernel_read_them(causal):
    _probe()
    q, k, v = _qkv(L=40, S=40, H=16, D=64)  # 40960 floats each: over PRE_MAX
    assert q.numel() > cheap.PRE_MAX
    attnlab.attention(q, k, v, is_causal=causal)  # the plan (SDPA's kernel)
    (sig, plan), = cheap._PLANS.items()
    assert sig[0].endswith("U") and plan.sdpa is not None
    order = []
    run, finite = plan.sdpa[0], plan.finite
    plan.sdpa = (lambda *a: order.append("sdpa") or run(*a), *plan.sdpa[1:])
    plan.finite = lambda x: order.append("check") or finite(x)
    want = attnlab.attention(q, k, v, is_causal=causal, backend="math")
    assert (plan.call(q, k, v) - want).abs().max().item() < 1e-5  # the Python plan
    assert order == ["sdpa", "check"] + ["check"] * 2 * causal
    served = _served(q, k, v, is_causal=causal)  # the C plan: the same checks, after SDPA
    assert type(served) is torch.Tensor and (served - want).abs().max().item() < 1e-5
    assert order == ["sdpa", "check"] + ["check"] * 2 * causal  # (the Python plan not called)
    x = v if causal else q
    x[0, 2, 30, 5] = float("nan")  # the kernel's result dropped: the full path's rules
    assert _served(q, k, v, is_causal=causal).endswith("U")
    got = attnlab.attention(q, k, v, is_causal=causal)
    cheap.clear()
    rules = attnlab.attention(q, k, v, is_causal=causal)  # the full path
    assert torch.isnan(got).any() and torch.equal(torch.isnan(got), torch.isnan(rules))
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(rules))
    assert not torch.isnan(got[0, 2, :30]).any()  # rows before the poisoned one stay clean


@pytest.mark.parametrize("D, scale", [(80, None), (80, 0.3), (64, 0.125)])
def test_a_plain_plan_leaves_sdpa_its_default_scale_only_where_it_is_the_same(D, scale):
    _probe()
    q, k, v = _qkv(L=4, S=4, D=D)
    attnlab.attention(q, k, v, is_causal=True, scale=scale)  # the plan
    (plan,) = cheap._PLANS.values()
    assert ("scale" in plan.call.keywords) == (scale == 0.3)  # 0.125 = 1/sqrt(64): the default
    got = attnlab.attention(q, k, v, is_causal=True, scale=scale)
    explicit = 1 / math.sqrt(D) if scale is None else scale
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                             scale=explicit)
    assert torch.equal(got, want)


def test_under_vmap_the_cheap_path_raises_what_the_full_path_raises(monkeypatch):
    q, k, v = _qkv()

    def error(kernel):
        monkeypatch.setenv("ATTNLAB_KERNEL", kernel)
        cheap.clear()
        with pytest.raises(RuntimeError) as e:
            torch.vmap(lambda x: attnlab.attention(x, k[0], v[0], is_causal=True))(q)
        return str(e.value)

    assert error("1") == error("0")  # the probe has no batching rule: Python's signature


def _served(q, k, v, **kw):
    """What the kernel's C entry gives this call: the output where a C plan served it, else the
    probe's string (None: not probed)."""
    a = {"dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False, "mask": None,
         "softcap": None, "return_lse": False, **kw}
    return cheap.serve(q, k, v, *a.values())


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"scale": 0.3}, {"mask": "causal"}])
def test_a_plan_under_the_finite_verdict_is_served_whole_in_c(kw, grad):
    _probe()
    kw = {**kw, "mask": masks.causal()} if "mask" in kw else kw
    q, k, v = (x.requires_grad_(grad) for x in _qkv(L=4, S=4))
    first = attnlab.attention(q, k, v, **kw)  # the full path keeps the plan, in C too
    got = _served(q, k, v, **kw)
    assert type(got) is torch.Tensor and torch.equal(got, first)
    causal = kw.get("is_causal", False) or "mask" in kw
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                             scale=kw.get("scale"))
    assert torch.equal(got, want)
    assert (type(got.grad_fn).__name__ == "ScaledDotProductFlashAttentionForCpuBackward0") == grad
    if grad:  # SDPA's own first-order gradients
        g = torch.randn_like(got)
        assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(got, (q, k, v), g),
                                                     torch.autograd.grad(want, (q, k, v), g)))
    # any other scalar, mask object, verdict or grad mode: not served (the probe's string)
    for other in ({**kw, "scale": 0.5}, {**kw, "is_causal": not kw.get("is_causal", False)},
                  {**kw, "enable_gqa": True}, {**kw, "dropout_p": 0.1}, {**kw, "softcap": 5.0},
                  {**kw, "return_lse": True}, {**kw, "is_causal": 1}):
        assert type(_served(q, k, v, **other)) is str
    if "mask" in kw:
        assert type(_served(q, k, v, **{**kw, "mask": masks.causal()})) is str
    with torch.no_grad():
        assert type(_served(q, k, v, **kw)) is str
    bad = v.detach().clone().requires_grad_(grad)  # the same layout
    with torch.no_grad():
        bad[0, 0, 0, 0] = float("nan")
    if causal:  # the keys and values checked: not served, the 'N' verdict for the full path
        assert _served(q, k, bad, **kw)[-1] == "N"
    else:  # only the queries (no mask: every row sees every key)
        assert type(_served(q, k, bad, **kw)) is torch.Tensor
        assert _served(bad, k, v, **kw)[-1] == "N"


def test_a_c_plan_follows_the_kernels_switches(monkeypatch):
    _probe()
    q, k, v = _qkv()
    attnlab.attention(q, k, v)
    assert type(_served(q, k, v)) is torch.Tensor
    was = os.environ.get("ATTNLAB_KERNEL_ISA")  # the value kept with the plan (a run may set it)
    monkeypatch.setenv("ATTNLAB_KERNEL_ISA", "avx2" if was == "scalar" else "scalar")
    assert type(_served(q, k, v)) is str  # another switch value: another signature
    if was is None:
        monkeypatch.delenv("ATTNLAB_KERNEL_ISA")
    else:
        monkeypatch.setenv("ATTNLAB_KERNEL_ISA", was)
    assert type(_served(q, k, v)) is torch.Tensor
    cheap.clear()
    assert type(_served(q, k, v)) is str


def test_a_c_plan_holds_its_mask_and_no_input():
    _probe()
    q, k, v = _qkv()
    m = masks.causal()
    attnlab.attention(q, k, v, mask=m)
    refs = [weakref.ref(x) for x in (q, k, v)]
    mask_ref = weakref.ref(m)
    del q, k, v, m
    gc.collect()
    assert all(r() is None for r in refs) and mask_ref() is not None  # its id stays its own
    cheap.clear()
    gc.collect()
    assert mask_ref() is None


def test_the_c_pre_hook_refuses_a_double_backward_as_the_python_one(monkeypatch):
    _probe()
    q, k, v = (x.requires_grad_() for x in _qkv(L=4, S=4))
    attnlab.attention(q, k, v, is_causal=True)  # the plan
    out = _served(q, k, v, is_causal=True)
    assert type(out) is torch.Tensor
    monkeypatch.setenv("ATTNLAB_MAX_DENSE_BYTES", "16")
    with pytest.raises(AttnlabError, match="create_graph"):
        torch.autograd.grad(out.sum(), (q, k, v), create_graph=True)


def test_served_calls_under_vmap_and_a_torch_function_mode_take_the_python_path():
    _probe()
    q, k, v = _qkv()
    attnlab.attention(q, k, v)
    seen = []

    class Mode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Mode():
        assert _served(q, k, v) is None
        attnlab.attention(q, k, v)
    assert torch.nn.functional.scaled_dot_product_attention in seen

    def under_vmap(x):
        assert _served(x, k, v) is None
        return x

    torch.vmap(under_vmap)(q)


@pytest.mark.slow
def test_a_served_calls_backward_runs_under_compiled_autograd():
    _probe()
    ca = pytest.importorskip("torch._dynamo.compiled_autograd")
    q, k, v = (x.requires_grad_() for x in _qkv(L=4, S=4))
    attnlab.attention(q, k, v, is_causal=True)  # the plan
    out = _served(q, k, v, is_causal=True)
    assert type(out) is torch.Tensor  # SDPA's node with the C pre-hook
    want = torch.autograd.grad(
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum(),
        (q, k, v))
    with ca._enable(torch.compile(backend="eager")):  # the hook's compiled_args
        out.sum().backward()
    for x, w in zip((q, k, v), want):
        assert (x.grad - w).abs().max().item() < 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_probe_checks_16_bit_inputs_and_their_plans_are_served_in_c(dtype):
    op = _probe()
    q, k, v = (x.to(dtype) for x in _qkv(L=3, S=5))
    assert op(q, k, v, cheap.PRE_MAX).endswith("F")
    for bad in (float("nan"), float("inf"), float("-inf")):
        x = v.clone()
        x[0, 1, 4, 7] = bad
        assert op(q, k, x, cheap.PRE_MAX).endswith("N") and op(q, k, x, -cheap.PRE_MAX)[-1] == "F"
        rows = torch.zeros(1, 5, 2, 8, dtype=dtype).transpose(1, 2)  # unit-stride rows, strided
        rows[0, 1, 4, 7] = bad  # the last row
        assert op(q, k, rows, cheap.PRE_MAX).endswith("N")
    big = torch.full((1, 1, 1, 8), 65504.0 if dtype == torch.float16 else 3e38, dtype=dtype)
    assert op(big, k, v, -cheap.PRE_MAX).endswith("F")  # the largest finite values are finite
    q, k, v = (x.to(dtype) for x in _qkv(L=4, S=4))
    for causal in (False, True):
        first = attnlab.attention(q, k, v, is_causal=causal)  # the plan
        got = _served(q, k, v, is_causal=causal)
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        assert type(got) is torch.Tensor and torch.equal(got, want) and torch.equal(first, want)
    poisoned = k.clone()
    poisoned[0, 0, 3, 0] = float("nan")  # the key of the last row: only that row poisoned
    assert _served(q, poisoned, v, is_causal=True)[-1] == "N"
    got = attnlab.attention(q, poisoned, v, is_causal=True)
    assert torch.isnan(got[0, 0, 3]).all() and not torch.isnan(got[0, 0, :3]).any()
    q, k, v = (x.to(dtype) for x in _qkv(L=40, S=40, H=16, D=64))  # over PRE_MAX: 'U'
    attnlab.attention(q, k, v)  # the plan, its query checked after SDPA's kernel
    got = _served(q, k, v)
    assert type(got) is torch.Tensor
    assert torch.equal(got, torch.nn.functional.scaled_dot_product_attention(q, k, v))
    q[0, 3, 7, 1] = float("inf")
    assert _served(q, k, v).endswith("U")
    got = attnlab.attention(q, k, v)
    assert torch.isnan(got[0, 3, 7]).all() and torch.isnan(got).sum() == 64


@pytest.mark.parametrize("causal", [False, True])
def test_a_3d_call_without_a_gradient_is_served_as_sdpa_takes_it(causal):
    _probe()
    q, k, v = (x[0] for x in _qkv(L=4, S=4))  # (H, L, D)
    attnlab.attention(q, k, v, is_causal=causal)  # the plan
    got = _served(q, k, v, is_causal=causal)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert type(got) is torch.Tensor and torch.equal(got, want)
    k[1, 2, 0] = float("nan")
    got = attnlab.attention(q, k, v, is_causal=causal)
    cheap.clear()
    rules = attnlab.attention(q, k, v, is_causal=causal)  # the full path
    assert torch.equal(torch.isnan(got), torch.isnan(rules))
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(rules))
    assert not torch.isnan(got[0]).any()  # the other head stays clean


def test_the_c_entry_reads_the_switches_from_os_environ_where_there_is_no_dict(monkeypatch):
    """Where os.environ has no `_data` dict (Windows), the switches are read from os.environ
    itself, a new value object each read: compared by value, never held past the call."""
    import ctypes

    from attnlab.ops import sdpa
    from attnlab.ops.kernels import build

    _probe()
    q, k, v = _qkv()
    attnlab.attention(q, k, v)  # installs the entry
    fn = build.c_entry("attnlab_cheap_entry")
    fn.restype, fn.argtypes = ctypes.py_object, [ctypes.py_object] * 4 + [ctypes.c_longlong] * 2

    def install(env, kernel, isa):
        fn(sdpa._twice, env, kernel, isa, cheap.PRE_MAX, cheap.MAX_PLANS)

    monkeypatch.setenv("ATTNLAB_KERNEL", "1")
    try:
        install(os.environ, "ATTNLAB_KERNEL", "ATTNLAB_KERNEL_ISA")
        cheap.clear()
        layout = _served(q, k, v)
        assert cheap._C[0][1](layout, 0.0, False, None, False, None, None, False, "1",
                              os.environ.get("ATTNLAB_KERNEL_ISA"), False, False, None, False)
        for _ in range(3):
            assert type(_served(q, k, v)) is torch.Tensor
        monkeypatch.setenv("ATTNLAB_KERNEL", "on")  # another value: not served
        assert type(_served(q, k, v)) is str
    finally:
        install(cheap._ENV, cheap._KERNEL, cheap._ISA)


def test_a_c_plan_dropped_for_another_node_leaves_the_eviction_order_too():
    """A hooked C plan is dropped where SDPA gives another node (here: its math kernel forced);
    a plan kept later under the same key is then the newest, not evicted before older ones."""
    import ctypes

    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnlab.ops import sdpa
    from attnlab.ops.kernels import build

    _probe()
    a = [x.requires_grad_() for x in _qkv(L=3, S=3)]
    b, c = _qkv(L=5, S=5), _qkv(L=6, S=6)
    attnlab.attention(*a, is_causal=True)  # installs the entry
    fn = build.c_entry("attnlab_cheap_entry")
    fn.restype, fn.argtypes = ctypes.py_object, [ctypes.py_object] * 4 + [ctypes.c_longlong] * 2
    try:
        fn(sdpa._twice, cheap._ENV, cheap._KERNEL, cheap._ISA, cheap.PRE_MAX, 2)  # 2 plans
        cheap.clear()
        attnlab.attention(*a, is_causal=True)  # A, hooked
        with sdpa_kernel(SDPBackend.MATH):  # another node: A's C plan dropped
            assert type(_served(*a, is_causal=True)) is str
        attnlab.attention(*b)  # B
        cheap._PLANS.pop(next(k for k, p in cheap._PLANS.items() if p.sdpa[0] is sdpa.flash))
        attnlab.attention(*a, is_causal=True)  # A kept again (its Python plan was gone)
        assert type(_served(*a, is_causal=True)) is torch.Tensor
        attnlab.attention(*c)  # C: one plan too many, B the oldest
        assert type(_served(*a, is_causal=True)) is torch.Tensor
        assert type(_served(*c)) is torch.Tensor and type(_served(*b)) is str
    finally:
        fn(sdpa._twice, cheap._ENV, cheap._KERNEL, cheap._ISA, cheap.PRE_MAX, cheap.MAX_PLANS)
