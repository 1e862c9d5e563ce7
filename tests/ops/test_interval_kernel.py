"""The compiled interval kernel against the float64 formula with FlashAttention's rule (error at
most 2x a plain fp32 implementation's, 3x for gradients), on every ISA build this CPU runs, over
mask kind x GQA x softcap x ALiBi x lengths; and the builds against each other."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab import AttnlabError
from attnlab.ops import kernels
from interval_cases import formula, intervals, isa_params, need_compiler

from helpers import assert_close

KINDS = ["full", "causal", "causal_br", "window", "window_br", "prefix", "document", "padding",
         "empty_rows", "all_empty"]
# (B, H, Hkv, L, S, D, Dv): odd lengths, L != S both ways, MHA / GQA / MQA, odd head dims
SHAPES = [(2, 4, 2, 97, 113, 59, 40), (1, 3, 1, 130, 65, 32, 32), (1, 2, 2, 70, 70, 64, 111)]
SLOPES = torch.tensor([0.5, 0.25, 0.125, 2 ** -0.5])


@pytest.fixture(autouse=True)
def _compiler():
    need_compiler()


def err(x, ref):
    fin = torch.isfinite(ref)
    if not bool(fin.any()):
        return 0.0
    return (x.double() - ref)[fin].abs().max().item()


def check_rule(got, plain, ref, factor, what):
    e, e_plain = err(got, ref), err(plain, ref)
    assert e <= factor * e_plain + 1e-6, f"{what}: error {e:.3e} > {factor} x {e_plain:.3e}"


def inputs(shape, seed, grad=False):
    B, H, Hkv, L, S, D, Dv = shape
    g = torch.Generator().manual_seed(seed)
    t = [torch.randn(*s, generator=g, dtype=torch.float64)
         for s in ((B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, Dv))]
    t[0] = t[0] * 2  # larger scores, so softcap bites
    return [x.requires_grad_(grad) for x in t]


def run_case(isa, shape, kind, softcap, alibi, grad):
    B, H, _, L, S, D, _ = shape
    if kind == "document" and L != S:
        pytest.skip("documents pair queries and keys one to one")
    lo, hi = intervals(kind, B, L, S)
    slopes = torch.cat([SLOPES] * 2)[:H] if alibi else None
    scale, pos = 1 / math.sqrt(D), (3, 11)
    q64, k64, v64 = inputs(shape, L + S + D, grad)
    kw = dict(scale=scale, softcap=softcap, slopes=slopes, pos_off=pos[1] - pos[0])
    ref = formula(q64, k64, v64, lo, hi, **kw)
    q32, k32, v32 = (x.detach().float().requires_grad_(grad) for x in (q64, k64, v64))
    plain = formula(q32, k32, v32, lo, hi, **kw)
    qk, kk, vk = (x.detach().float().requires_grad_(grad) for x in (q64, k64, v64))
    out = kernels.interval_attention(qk, kk, vk, lo, hi, scale=scale, softcap=softcap,
                                     alibi=slopes, q_pos0=pos[0], k_pos0=pos[1], isa=isa)
    for name, i in (("out", 0), ("lse", 1)):
        check_rule(out[i], plain[i], ref[i], 2, f"{isa} {kind} {name}")
    empty = ~torch.isfinite(ref[1])
    assert bool(out[0][empty].eq(0).all()) and bool(out[1][empty].eq(-math.inf).all())
    if not grad:
        return
    g = torch.Generator().manual_seed(1)
    go, gl = torch.randn(out[0].shape, generator=g), torch.randn(out[1].shape, generator=g)
    for o, l in (ref, plain, out):
        gl_ = torch.where(torch.isfinite(l), gl.to(l.dtype), 0)
        (o * go.to(o.dtype)).sum().add((torch.where(torch.isfinite(l), l, 0) * gl_).sum()) \
            .backward()
    for name, a, b, c in zip("qkv", (q64, k64, v64), (q32, k32, v32), (qk, kk, vk)):
        check_rule(c.grad, b.grad, a.grad, 3, f"{isa} {kind} d{name}")
        assert bool(torch.isfinite(c.grad).all())


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_backward_every_mask_kind(isa, kind, shape):
    run_case(isa, shape, kind, None, False, grad=True)


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("softcap,alibi", [(5.0, False), (None, True), (3.0, True)])
@pytest.mark.parametrize("kind", ["causal_br", "window", "padding"])
def test_softcap_and_alibi(isa, softcap, alibi, kind):
    run_case(isa, SHAPES[0], kind, softcap, alibi, grad=True)


@pytest.mark.parametrize("mode", ["fused", "split"])
@pytest.mark.parametrize("kind", ["causal_br", "window", "empty_rows", "padding"])
@pytest.mark.parametrize("shape", SHAPES[:2])
def test_both_backward_schedules(mode, kind, shape, monkeypatch):
    """dQ added during the dK/dV pass (fused) and a separate dQ pass (split) both keep the rule,
    whatever the thread count would pick."""
    monkeypatch.setenv("ATTNLAB_KERNEL_BWD", mode)
    run_case(None, shape, kind, 3.0, True, grad=True)


def test_backward_schedule_is_checked(monkeypatch):
    monkeypatch.setenv("ATTNLAB_KERNEL_BWD", "both")
    q = torch.randn(1, 1, 4, 8, requires_grad=True)
    lo, hi = torch.zeros(1, 1, 4, dtype=torch.int32), torch.full((1, 1, 4), 4, dtype=torch.int32)
    out, _ = kernels.interval_attention(q, q, q, lo, hi, scale=1.0)
    with pytest.raises(RuntimeError, match="ATTNLAB_KERNEL_BWD"):
        out.sum().backward()


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("S,n", [(1, 59), (16, 64), (33, 7)])
def test_compiled_keys_last_is_the_gate_layout(isa, S, n):
    from attnlab.ops.kernels import build, gate

    x = torch.randn(2, 3, S, n)
    assert torch.equal(build.get(isa).keys_last(x), gate.keys_last(x))


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("S,n", [(1, 7), (5, 24), (70, 33)])
def test_compiled_rows_padded_is_the_gate_layout(isa, S, n):
    from attnlab.ops.kernels import build, gate

    x = torch.randn(3, 4, S, n).transpose(0, 1)  # batch and head strides of a view: read in place
    width = gate.padded_width(n)
    got = build.get(isa).rows_padded(x, width)
    assert got.shape == (4, 3, S, width) and torch.equal(got, gate.rows_padded(x))
    with pytest.raises(RuntimeError, match="width"):
        build.get(isa).rows_padded(x, n - 1)


@pytest.mark.parametrize("L,S", [(1, 1), (1, 300), (300, 1), (257, 257)])
def test_lengths_at_block_edges(L, S):
    run_case(None, (1, 2, 1, L, S, 16, 24), "causal_br", 4.0, True, grad=True)


def test_builds_agree():
    """Every ISA build this CPU runs gives the same numbers up to fp32 rounding."""
    shape = (1, 4, 2, 150, 170, 48, 40)
    q, k, v = (x.float() for x in inputs(shape, 7))
    lo, hi = intervals("window_br", 1, 150, 170)
    outs = [kernels.interval_forward(q, k, v, lo, hi, scale=0.2, softcap=6.0, alibi=SLOPES,
                                     isa=isa) for isa in kernels.runnable()]
    for o, lse in outs[1:]:
        assert_close(o, outs[0][0], atol=2e-6, rtol=1e-5, what="out")
        assert_close(lse, outs[0][1], atol=2e-6, rtol=1e-6, what="lse")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs(dtype):
    shape = (1, 2, 1, 60, 80, 32, 32)
    q, k, v = (x.to(dtype) for x in inputs(shape, 3))
    lo, hi = intervals("window_br", 1, 60, 80)
    out, lse = kernels.interval_forward(q, k, v, lo, hi, scale=0.2)
    assert out.dtype == dtype and lse.dtype == torch.float32
    ref, ref_lse = formula(q.double(), k.double(), v.double(), lo, hi, 0.2)
    plain, _ = formula(q, k, v, lo, hi, 0.2)
    check_rule(out, plain, ref, 2, f"{dtype} out")
    assert err(lse, ref_lse) < 1e-5


def test_strided_and_expanded_inputs():
    """Transposed, sliced and expanded (stride 0) inputs give the contiguous inputs' answer."""
    B, H, L, S, D = 2, 4, 50, 70, 16
    base = torch.randn(B, L, H, 2 * D)
    q = base.transpose(1, 2)[..., ::2]  # (B, H, L, D), non-contiguous
    k = torch.randn(B, 1, S, D).expand(B, 2, S, D)  # stride 0 over heads
    v = torch.randn(B, S, 2, D).transpose(1, 2)
    lo, hi = intervals("window", B, L, S)
    got = kernels.interval_forward(q, k, v, lo.expand(B, H, L), hi, scale=0.3)
    want = kernels.interval_forward(q.contiguous(), k.contiguous(), v.contiguous(), lo, hi,
                                    scale=0.3)
    assert_close(got[0], want[0], atol=0, rtol=0, what="out")
    assert_close(got[1], want[1], atol=0, rtol=0, what="lse")


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("D,Dv", [(32, 48), (40, 24)])
def test_row_views_of_every_head_are_read_in_place(isa, D, Dv):
    """A block of rows of a larger tensor (every head, any batch and head strides: what a
    context-parallel block passes) gives exactly the answer and gradients of its contiguous
    copy, forward and backward, with q, k, v and dout not copied."""
    from attnlab.ops.kernels import gate

    B, H, Hkv, n, m = 2, 4, 2, 90, 110
    q_all, dout_all = torch.randn(B, H, 2 * n, D), torch.randn(B, H, 2 * n, Dv)
    k_all, v_all = torch.randn(B, Hkv, 3 * m, D), torch.randn(B, Hkv, 3 * m, Dv)
    q, dout = q_all[:, :, 17:17 + n], dout_all[:, :, 17:17 + n]
    k, v = k_all[:, :, m:2 * m], v_all[:, :, 5:5 + m]
    assert not any(x.is_contiguous() for x in (q, k, v, dout))
    assert all(gate.rows(x) is x for x in (q, k, v, dout))
    lo, hi = intervals("window_br", B, n, m)
    kw = dict(scale=0.2, softcap=5.0, alibi=SLOPES, q_pos0=4, k_pos0=9, isa=isa)
    out, lse = kernels.interval_forward(q, k, v, lo, hi, **kw)
    dense = [x.contiguous() for x in (q, k, v, dout)]
    want_out, want_lse = kernels.interval_forward(*dense[:3], lo, hi, **kw)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    out_rows = torch.zeros(B, H, 2 * n, Dv)[:, :, 3:3 + n].copy_(out)  # a row view as well
    got = kernels.interval_backward(q, k, v, lo, hi, out_rows, lse, dout, **kw)
    want = kernels.interval_backward(*dense[:3], lo, hi, want_out, want_lse, dense[3], **kw)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.equal(g, w), name


@pytest.mark.parametrize("isa", isa_params())
def test_a_gradient_of_any_strides_is_read_in_place(isa):
    """dout expanded from one value (the gradient of out.sum()), per row, over rows (read in
    place with row stride 0), or transposed gives exactly the gradients of its contiguous copy;
    L = 70 leaves a last panel of 6 rows, which is packed."""
    B, H, Hkv, L, S, D = 1, 4, 2, 70, 90, 32
    q, k, v = torch.randn(B, H, L, D), torch.randn(B, Hkv, S, D), torch.randn(B, Hkv, S, D)
    lo, hi = intervals("window_br", B, L, S)
    kw = dict(scale=0.2, softcap=5.0, alibi=SLOPES, isa=isa)
    out, lse = kernels.interval_forward(q, k, v, lo, hi, **kw)
    for dout in (torch.tensor(1.0).expand(B, H, L, D),
                 torch.randn(B, H, L, 1).expand(-1, -1, -1, D),
                 torch.randn(B, H, 1, D).expand(-1, -1, L, -1),
                 torch.randn(B, D, H, L).permute(0, 2, 3, 1)):
        got = kernels.interval_backward(q, k, v, lo, hi, out, lse, dout, **kw)
        want = kernels.interval_backward(q, k, v, lo, hi, out, lse, dout.contiguous(), **kw)
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5, msg=name)


def test_rows_copies_only_what_the_kernel_cannot_read():
    from attnlab.ops.kernels import gate

    x = torch.randn(2, 3, 10, 8)
    assert gate.rows(x) is x and gate.rows(x[:, 1:, 2:7]) is not None
    assert gate.rows(x[:, :, 2:7]).data_ptr() == x[:, :, 2:7].data_ptr()  # rows: in place
    for bad in (x[..., ::2], x.transpose(2, 3), x[:, :, ::2]):
        r = gate.rows(bad)
        assert r.is_contiguous() and torch.equal(r, bad)
    assert gate.rows(x.half()).dtype == torch.float32


def test_dlse_only_and_global_lse():
    """interval_backward with a larger lse than its keys give (a context-parallel block) returns
    the keys' share: summing two halves' dq gives the whole dq."""
    shape = (1, 2, 2, 40, 64, 16, 16)
    q, k, v = (x.float() for x in inputs(shape, 5))
    lo, hi = intervals("causal_br", 1, 40, 64)
    out, lse = kernels.interval_forward(q, k, v, lo, hi, scale=0.25)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    whole = kernels.interval_backward(q, k, v, lo, hi, out, lse, dout, dlse, scale=0.25)
    parts = [kernels.interval_backward(q, k[:, :, a:b], v[:, :, a:b], (lo - a).clamp(0, b - a),
                                       (hi - a).clamp(0, b - a), out, lse, dout, dlse,
                                       scale=0.25) for a, b in ((0, 32), (32, 64))]
    assert_close(parts[0][0] + parts[1][0], whole[0], atol=1e-5, rtol=1e-4, what="dq")
    assert_close(torch.cat([parts[0][1], parts[1][1]], 2), whole[1], atol=1e-6, what="dk")


def test_bad_arguments_name_themselves():
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    lo, hi = torch.zeros(1, 1, 5, dtype=torch.int32), torch.full((1, 1, 5), 6)
    with pytest.raises(AttnlabError, match="hi: expected"):
        kernels.interval_forward(q, k, v, lo, hi[..., :4], scale=1.0)
    with pytest.raises(AttnlabError, match=r"lo, hi: a row's keys must lie in \[0, S = 6\)"):
        kernels.interval_forward(q, k, v, lo, hi + 1, scale=1.0)
    with pytest.raises(AttnlabError, match="float64"):
        kernels.interval_forward(q.double(), k, v, lo, hi, scale=1.0)
    with pytest.raises(AttnlabError, match="k: expected"):
        kernels.interval_forward(q, k[:, :, :, :4], v, lo, hi, scale=1.0)
    with pytest.raises(AttnlabError, match="alibi"):
        kernels.interval_forward(q, k, v, lo, hi, scale=1.0, alibi=torch.ones(3))
