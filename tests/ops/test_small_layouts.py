"""Small calls in the layouts models make besides (B, H, L, D): 2-D (L, D) and 3-D (H, L, D)
inputs with a gradient run on SDPA's own flash node as views with leading dims of 1 (`sdpa.flash`),
served whole in C from their second call; their outputs, gradients, second order, NaN/Inf rules
and errors are those of the same call made on the 4-D views (and those of `sdpa._FlashLse`, which
ran them before)."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import AttnlabError
from attnlab.ops import cheap, sdpa

FLASH = "ScaledDotProductFlashAttentionForCpuBackward0"

#: (query shape, key/value shape, enable_gqa)
SHAPES = {"3d": ((4, 5, 8), (4, 5, 8), False), "2d": ((5, 8), (5, 8), False),
          "3d-gqa": ((4, 5, 8), (2, 5, 8), True), "3d-S": ((2, 3, 8), (2, 6, 8), False)}


@pytest.fixture(autouse=True)
def _fresh():
    cheap.clear()
    yield
    cheap.clear()


def _kernel():
    from attnlab.ops import kernels

    if not kernels.available():
        pytest.skip("the kernel is not available here")


def _inputs(name, seed=0, dtype=torch.float32):
    qs, kvs, gqa = SHAPES[name]
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(s, generator=g, dtype=dtype).requires_grad_() for s in (qs, kvs, kvs))
    return q, k, v, gqa


def _as4(x):
    return x.detach().reshape((1,) * (4 - x.dim()) + tuple(x.shape)).requires_grad_()


def _served(q, k, v, causal, gqa):
    return cheap.serve(q, k, v, 0.0, causal, None, gqa, None, None, False)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(SHAPES))
def test_a_call_with_a_gradient_is_served_in_c_on_sdpas_flash_node(name, causal):
    _kernel()
    q, k, v, gqa = _inputs(name)
    first = attnlab.attention(q, k, v, is_causal=causal, enable_gqa=gqa)  # the full path
    got = _served(q, k, v, causal, gqa)
    assert type(got) is torch.Tensor  # kept in C, served there
    q4, k4, v4 = (_as4(x) for x in (q, k, v))
    if causal:
        assert "small top-left causal" in attnlab.select_backend(
            q, k, v, is_causal=True, enable_gqa=gqa).reason
    # the 4-D call's output bit for bit (SDPA's flash kernel), its layout viewed back
    want = torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, is_causal=causal,
                                                             enable_gqa=gqa)
    for out in (first, got):
        assert out.shape == q.shape and torch.equal(out, want.view(q.shape))
        assert out.stride() == want.view(q.shape).stride()
        assert out.grad_fn.next_functions[0][0].name() == FLASH  # a view over SDPA's node
    if not gqa:  # the Function that ran such calls before: the same numbers
        old, _ = sdpa._FlashLse.apply(q4, k4, v4, None, causal, q.shape[-1] ** -0.5)
        assert torch.equal(got, old.reshape(q.shape))
    g = torch.randn_like(got)
    grads = torch.autograd.grad(got, (q, k, v), g)
    want_grads = torch.autograd.grad(want, (q4, k4, v4), g.view(want.shape))
    assert all(a.shape == x.shape and torch.equal(a, b.view(x.shape))
               for a, b, x in zip(grads, want_grads, (q, k, v)))
    assert len(cheap._PLANS) == 1


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["3d", "2d", "3d-gqa"])
def test_a_kept_call_differentiates_twice(name, causal):
    q, k, v, gqa = _inputs(name, dtype=torch.float64)
    attnlab.attention(q, k, v, is_causal=causal, enable_gqa=gqa)  # the plan

    def fn(a, b, c):
        return attnlab.attention(a, b, c, is_causal=causal, enable_gqa=gqa)

    assert torch.autograd.gradcheck(fn, (q, k, v))
    assert torch.autograd.gradgradcheck(fn, (q, k, v))
    q, k, v, gqa = _inputs(name)  # float32: SDPA's node with the C hook, against math
    attnlab.attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    out = fn(q, k, v)
    ref = attnlab.attention(q, k, v, is_causal=causal, enable_gqa=gqa, backend="math")
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g, create_graph=True)
    want = torch.autograd.grad(ref, (q, k, v), g, create_graph=True)
    second = torch.autograd.grad(sum((x * x).sum() for x in got), (q, k, v))
    second_want = torch.autograd.grad(sum((x * x).sum() for x in want), (q, k, v))
    for a, b in zip((*got, *second), (*want, *second_want)):
        assert (a - b).abs().max().item() < 1e-4


@pytest.mark.parametrize("name", ["3d", "2d"])
def test_a_refused_double_backward_says_what_the_flash_function_said(name, monkeypatch):
    _kernel()
    q, k, v, gqa = _inputs(name)
    attnlab.attention(q, k, v, is_causal=True)  # the plan
    out = _served(q, k, v, True, gqa)
    assert type(out) is torch.Tensor
    monkeypatch.setenv("ATTNLAB_MAX_DENSE_BYTES", "16")
    with pytest.raises(AttnlabError) as got:
        torch.autograd.grad(out.sum(), (q, k, v), create_graph=True)
    q4, k4, v4 = (_as4(x) for x in (q, k, v))
    old, _ = sdpa._FlashLse.apply(q4, k4, v4, None, True, q.shape[-1] ** -0.5)
    with pytest.raises(AttnlabError) as want:
        torch.autograd.grad(old.sum(), (q4, k4, v4), create_graph=True)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("where", ["query", "key", "value"])
@pytest.mark.parametrize("name", ["3d", "2d"])
def test_nonfinite_inputs_follow_the_4d_calls_rules(name, where, causal, bad):
    q, k, v = _inputs(name)[:3]
    attnlab.attention(q, k, v, is_causal=causal)  # the plan
    with torch.no_grad():
        {"query": q, "key": k, "value": v}[where][..., 2, 3] = bad
    out = attnlab.attention(q, k, v, is_causal=causal)
    g = torch.randn_like(out)
    got = (out, *torch.autograd.grad(out, (q, k, v), g))
    q4, k4, v4 = (_as4(x) for x in (q, k, v))
    out4 = attnlab.attention(q4, k4, v4, is_causal=causal)
    want = (out4, *torch.autograd.grad(out4, (q4, k4, v4), g.view(out4.shape)))
    for a, b in zip(got, want):
        b = b.view(a.shape)
        assert torch.equal(torch.isnan(a), torch.isnan(b))
        assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
    if causal and where != "query":
        assert not torch.isnan(out[..., :2, :]).any()  # rows before the poisoned key stay clean


@pytest.mark.parametrize("causal", [False, True])
def test_a_2d_call_without_a_gradient_is_served_as_sdpa_takes_it(causal):
    _kernel()
    q, k, v = (x.detach() for x in _inputs("2d")[:3])
    first = attnlab.attention(q, k, v, is_causal=causal)  # the plan
    got = _served(q, k, v, causal, False)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert type(got) is torch.Tensor and torch.equal(got, want) and torch.equal(first, want)


#: strided views (.., n) of unit-stride rows, each of a flat base of `n` floats: (n, view of it)
VIEWS = [
    (144, lambda b: b.view(2, 3, 24)[..., :8].unflatten(-1, (4, 2)).transpose(1, 2)),  # q of a
    # projection's (B, L, 3·H·D) block as (B, H, L, D), H 4, D 2
    (144, lambda b: b.view(2, 3, 24)[..., 8:16].unflatten(-1, (4, 2)).transpose(1, 2)[:, ::2]),
    (60, lambda b: b.view(3, 5, 4)[:, 1:4]),  # rows sliced
    (24, lambda b: b.view(2, 1, 3, 4).expand(2, 3, 3, 4)),  # a broadcast head dim
    (24, lambda b: b.view(4, 3, 2).permute(1, 0, 2)[:, 1:]),  # permuted and sliced
    (24, lambda b: b.as_strided((3, 4, 2), (2, 6, 1))),  # spans that overlap
]


@pytest.mark.parametrize("n, view", VIEWS)
def test_the_probe_sees_exactly_the_values_of_a_strided_input(n, view):
    """A NaN/Inf anywhere in the view's values gives 'N'; one in its base outside them, 'F'."""
    _kernel()
    from attnlab.ops.kernels import build

    op = build.get().probe
    mine = set(view(torch.arange(n, dtype=torch.float32)).flatten().tolist())  # base indices
    ok = torch.randn(1, 2)
    for i in range(n):
        for bad in (float("nan"), float("inf"), float("-inf")):
            base = torch.randn(n)
            base[i] = bad
            x = view(base)
            assert x.stride(-1) == 1 and not x.is_contiguous()
            want = "N" if i in mine else "F"
            assert op(x, ok, ok, -cheap.PRE_MAX)[-1] == want, (i, bad)
            assert op(ok, ok, x, cheap.PRE_MAX)[-1] == want
            assert op(ok, x, ok, -cheap.PRE_MAX)[-1] == "F"  # only the query checked
