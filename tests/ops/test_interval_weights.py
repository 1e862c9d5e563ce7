"""Rows of exact weights from the interval kernel (`kernels.interval_weights`, and
`attnlab.attention_weights` on every interval-shaped call): FlashAttention's rule against the
float64 definition on every ISA build, exact zeros outside each row's interval, inputs of any
dtype and strides, and the public call taking the kernel."""

from __future__ import annotations

import math

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.errors import AttnlabError
from attnlab.ops import kernels
from attnlab.ops.kernels import build, kernel, runner
from interval_cases import intervals, isa_params, need_compiler, weights

from helpers import assert_close

KINDS = ["full", "causal", "causal_br", "window", "window_br", "prefix", "document", "padding",
         "empty_rows", "all_empty"]
# (B, H, Hkv, L, S, D): odd lengths, L != S both ways, MHA / GQA / MQA, odd head dims
SHAPES = [(2, 4, 2, 97, 113, 59), (1, 3, 1, 130, 65, 32), (1, 2, 2, 70, 70, 64)]


@pytest.fixture(autouse=True)
def _compiler():
    need_compiler()


def err(x, ref):
    return (x.double() - ref).abs().max().item() if ref.numel() else 0.0


def inputs(shape, seed, dtype=torch.float64):
    B, H, Hkv, L, S, D = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64) * 2  # softcap bites
    k = torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype)


def check(isa, shape, kind, rows, softcap=None, alibi=False, pos=(0, 0)):
    B, H, _, L, S, D = shape
    if kind == "document" and L != S:
        pytest.skip("documents pair queries and keys one to one")
    lo, hi = intervals(kind, B, L, S)
    slopes = torch.linspace(0.1, 1.0, H) if alibi else None
    kw = dict(scale=1 / math.sqrt(D), softcap=softcap)
    q64, k64 = inputs(shape, L + S + D)
    ref, _ = weights(q64, k64, lo, hi, slopes=slopes, pos_off=pos[1] - pos[0], **kw)
    plain, _ = weights(q64.float(), k64.float(), lo, hi, slopes=slopes,
                       pos_off=pos[1] - pos[0], **kw)
    q, k = q64.float(), k64.float()
    v = torch.zeros((*k.shape[:-1], 8))
    _, lse = kernels.interval_forward(q, k, v, lo, hi, alibi=slopes, q_pos0=pos[0],
                                      k_pos0=pos[1], isa=isa, **kw)
    w = kernels.interval_weights(q, k, lse, lo, hi, rows, alibi=slopes, q_pos0=pos[0],
                                 k_pos0=pos[1], isa=isa, **kw)
    idx = torch.arange(L) if rows is None else torch.as_tensor(rows)
    ref, plain = ref[:, :, idx], plain[:, :, idx]
    e, e_plain = err(w, ref), err(plain, ref)
    assert e <= 2 * e_plain + 1e-6, f"{isa} {kind}: weights error {e:.3e} > 2 x {e_plain:.3e}"
    assert w.dtype == torch.float32 and w.shape == (B, H, len(idx), S)
    assert bool(w[ref == 0].eq(0).all()), "a weight outside a row's interval is not exactly 0"
    alive = ref.sum(-1) > 0  # rows that attend something sum to 1 as closely as fp32 does
    one = ref.sum(-1)[alive]
    e, e_plain = err(w.sum(-1)[alive], one), err(plain.sum(-1)[alive], one)
    assert e <= 2 * e_plain + 1e-6, f"{isa} {kind}: row sums off by {e:.3e} > 2 x {e_plain:.3e}"


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_every_mask_kind_matches_the_definition(isa, kind, shape):
    L = shape[3]
    check(isa, shape, kind, [L - 1, 0, 5, 5, L // 2, 2])  # unordered, repeated rows


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("softcap,alibi", [(5.0, False), (None, True), (3.0, True)])
@pytest.mark.parametrize("kind", ["causal_br", "window", "padding"])
def test_softcap_alibi_and_positions(isa, softcap, alibi, kind):
    check(isa, SHAPES[0], kind, None, softcap, alibi, pos=(3, 11))


@pytest.mark.parametrize("L,S", [(1, 1), (1, 300), (300, 1), (257, 257)])
def test_lengths_at_block_edges(L, S):
    check(None, (1, 2, 1, L, S, 16), "full", None)
    check(None, (1, 2, 1, L, S, 16), "causal_br", None)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_convert_only_the_keys_attended(dtype):
    B, _, Hkv, L, S, _ = shape = (2, 4, 2, 90, 90, 32)
    q, k = inputs(shape, 5, dtype)
    lo, hi = intervals("window", B, L, S)
    v = torch.zeros(B, Hkv, S, 8, dtype=dtype)
    _, lse = kernels.interval_forward(q, k, v, lo, hi, scale=0.2)
    w = kernels.interval_weights(q, k, lse, lo, hi, [60, 40], scale=0.2)  # keys 34..60 only
    ref, _ = weights(q.double(), k.double(), lo, hi, 0.2)
    assert w.dtype == torch.float32
    assert_close(w, ref[:, :, [60, 40]].float(), atol=2e-6, what=f"{dtype} weights")


def test_strided_and_expanded_inputs_give_identical_rows():
    B, _, Hkv, L, S, _ = shape = (2, 4, 2, 50, 60, 24)
    q, k = inputs(shape, 6, torch.float32)
    lo, hi = intervals("causal_br", B, L, S)
    _, lse = kernels.interval_forward(q, k, torch.zeros(B, Hkv, S, 8), lo, hi, scale=0.3)
    rows = [49, 3, 20]
    want = kernels.interval_weights(q, k, lse, lo, hi, rows, scale=0.3)
    q_t = q.transpose(2, 3).contiguous().transpose(2, 3)  # rows not contiguous: copied rows
    k_t = k.transpose(2, 3).contiguous().transpose(2, 3)  # copied keys, only those attended
    k_x = k[:1].expand(B, -1, -1, -1)  # a batch stride of 0: read in place
    assert not kernels.gate.in_place(q_t) and kernels.gate.in_place(k_x)
    assert torch.equal(kernels.interval_weights(q_t, k_t, lse, lo, hi, rows, scale=0.3), want)
    _, lse_x = kernels.interval_forward(q, k_x, torch.zeros(B, Hkv, S, 8), lo, hi, scale=0.3)
    got = kernels.interval_weights(q, k_x, lse_x, lo, hi, rows, scale=0.3)
    assert torch.equal(got[0], want[0])


def test_rows_without_keys_and_lse_minus_inf_are_zero():
    q, k = inputs((1, 2, 1, 12, 12, 8), 7, torch.float32)
    lo, hi = intervals("empty_rows", 1, 12, 12)  # rows 0, 3, 6, 9 attend nothing
    _, lse = kernels.interval_forward(q, k, torch.zeros(1, 1, 12, 8), lo, hi, scale=0.5)
    lse[:, 1, 4] = -math.inf  # a row whose forward found nothing: all zero, never NaN
    w = kernels.interval_weights(q, k, lse, lo, hi, None, scale=0.5)
    assert bool(w[:, :, ::3].eq(0).all()) and bool(w[:, 1, 4].eq(0).all())
    assert bool(torch.isfinite(w).all())


def test_a_large_mostly_zero_result_is_zero_outside_the_window():
    L, H = 8192, 16  # one row of 16 heads: 512 KiB, zeroed by the OS page by page
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, H, L, 16, generator=g) for _ in range(3))
    mask = masks.sliding_window(100)
    _, lse = attnlab.attention(q, k, v, mask=mask, return_lse=True)
    w = attnlab.attention_weights(q, k, lse, rows=[5000], mask=mask)
    assert bool(w[..., :4901].eq(0).all()) and bool(w[..., 5001:].eq(0).all())
    assert_close(w.sum(-1), torch.ones(1, H, 1), atol=2e-6, what="rows sum")
    ref = attnlab.attention_weights(q.double(), k.double(), lse.double(), rows=[5000], mask=mask)
    assert_close(w, ref.float(), atol=1e-6, what="weights vs float64")


def test_public_call_takes_the_kernel_and_agrees_with_the_pytorch_path(monkeypatch):
    if not kernels.available():
        pytest.skip("the kernel is not available here")
    calls = []
    real = kernel._weights
    monkeypatch.setattr(kernel, "_weights", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 4, 40, 16, generator=g) for _ in range(3))
    kw = dict(mask=masks.sliding_window(9) & masks.padding(key_lengths=[40, 31]), softcap=4.0,
              alibi_slopes=torch.linspace(0.1, 0.5, 4))
    _, lse = attnlab.attention(q, k, v, return_lse=True, **kw)
    fast = attnlab.attention_weights(q, k, lse, rows=slice(1, 40, 3), **kw)
    assert calls == [1]
    monkeypatch.setattr(runner, "applies", lambda p: False)
    slow = attnlab.attention_weights(q, k, lse, rows=slice(1, 40, 3), **kw)
    assert calls == [1]
    assert_close(fast, slow, atol=1e-6, what="kernel vs PyTorch weights")


@pytest.mark.parametrize("why", ["score_mod", "float64", "attn_mask", "off"])
def test_other_calls_keep_the_pytorch_path(why, monkeypatch):
    calls = []
    monkeypatch.setattr(kernel, "_weights", lambda *a, **kw: calls.append(1))
    q, k, v = (torch.randn(1, 2, 10, 8) for _ in range(3))
    kw = {"score_mod": dict(score_mod=lambda s, b, h, i, j: s * 0.5),
          "float64": {}, "attn_mask": dict(attn_mask=torch.rand(10, 10) > 0.3), "off": {}}[why]
    if why == "float64":
        q, k, v = q.double(), k.double(), v.double()
    if why == "off":
        monkeypatch.setenv("ATTNLAB_KERNEL", "0")
    _, lse = attnlab.attention(q, k, v, return_lse=True, is_causal=why != "attn_mask", **kw)
    w = attnlab.attention_weights(q, k, lse, rows=[3], is_causal=why != "attn_mask", **kw)
    assert calls == [] and w.shape == (1, 2, 1, 10)


def test_bad_arguments_name_what_is_wrong():
    q, k = inputs((1, 2, 1, 10, 12, 8), 10, torch.float32)
    lo, hi = intervals("causal", 1, 10, 12)
    with pytest.raises(AttnlabError, match=r"lse: expected \(B, H, L\) = \(1, 2, 10\)"):
        kernels.interval_weights(q, k, torch.zeros(1, 2, 9), lo, hi, scale=1.0)
    with pytest.raises(AttnlabError, match="rows: indices must lie in"):
        kernels.interval_weights(q, k, torch.zeros(1, 2, 10), lo, hi, [10], scale=1.0)
    ops = build.get(None)
    if ops is None:
        pytest.skip("the kernel is not available here")
    lo32, hi32 = lo.int(), hi.int()
    with pytest.raises(RuntimeError, match="are not among the keys given"):  # keys 0..4 of 12
        ops.weights(q, k[:, :, 2:], torch.tensor([3]), None, torch.zeros(1, 2, 10), lo32, hi32,
                    None, 1.0, 0.0, 0, 2, 12)
    with pytest.raises(RuntimeError, match="idx: row 10 outside"):
        ops.weights(q, k, torch.tensor([10]), None, torch.zeros(1, 2, 10), lo32, hi32, None,
                    1.0, 0.0, 0, 0, 12)


def test_the_forward_still_requires_values():
    q, k = inputs((1, 2, 1, 10, 12, 8), 11, torch.float32)
    lo, hi = intervals("causal", 1, 10, 12)
    with pytest.raises(AttnlabError, match="v: expected a 4-d tensor"):
        kernels.interval_forward(q, k, None, lo, hi, scale=1.0)


def test_intervals_are_kept_with_the_mask_for_the_latest_sizes():
    from attnlab.masks import base

    mask = masks.sliding_window(3)
    q = torch.randn(1, 2, 40, 8)
    first = None
    for L in range(10, 10 + 2 * base.SIZES_KEPT):
        attnlab.attention(q[:, :, :L], q[:, :, :L], q[:, :, :L], mask=mask)
        got = mask.intervals(L, L)
        first = first or got
        assert mask.intervals(L, L) is got  # asked again: the same tensors, not recomputed
    kept = base._INTERVALS[mask]
    assert list(kept) == [(L, L, None)
                          for L in range(10 + base.SIZES_KEPT, 10 + 2 * base.SIZES_KEPT)]
    lo, hi = kept[(17, 17, None)]
    assert torch.equal(hi[0, 0], torch.arange(1, 18, dtype=torch.int32))
    assert torch.equal(lo[0, 0], (torch.arange(17) - 2).clamp(min=0).int())
    assert mask.intervals(10, 10) is not first  # dropped, then computed again


@pytest.mark.parametrize("isa", isa_params())
def test_per_batch_and_per_head_intervals(isa):
    B, H, Hkv, L, S, _ = shape = (2, 4, 2, 33, 41, 16)
    q, k = inputs(shape, 12, torch.float32)
    i = torch.arange(L)
    width = torch.tensor([[2, 5, 9, 40], [1, 3, 7, 11]])[..., None]  # (B, H, 1): a window each
    hi = (i + 3).clamp(max=S).expand(B, H, L)
    lo = (hi - width).clamp(min=0)
    _, lse = kernels.interval_forward(q, k, torch.zeros(B, Hkv, S, 8), lo, hi, scale=0.3,
                                      isa=isa)
    w = kernels.interval_weights(q, k, lse, lo, hi, [0, 32, 17], scale=0.3, isa=isa)
    ref, _ = weights(q.double(), k.double(), lo, hi, 0.3)
    assert_close(w, ref[:, :, [0, 32, 17]].float(), atol=2e-6, what=f"{isa} per-head weights")


def test_large_intervals_are_not_kept(monkeypatch):
    from attnlab.masks import base

    monkeypatch.setattr(base, "KEPT_ROWS", 100)
    mask = masks.causal()
    assert mask.intervals(101, 101) is not mask.intervals(101, 101)  # recomputed each time
    assert mask.intervals(100, 100) is mask.intervals(100, 100)


def test_intervals_copied_to_a_device_are_kept_the_same_way():
    from attnlab.masks import base

    mask = masks.sliding_window(5)
    got = mask.intervals_copied(30, 30, "cpu")
    assert mask.intervals_copied(30, 30, torch.device("cpu")) is got
    assert all(torch.equal(a, b) for a, b in zip(got, mask.intervals(30, 30)))
    for L in range(31, 31 + base.SIZES_KEPT):
        mask.intervals_copied(L, L, "cpu")
    assert (30, 30, "copied to cpu") not in base._INTERVALS[mask]  # the oldest left first
