"""attnlab.attention with the interval kernel wired in as backend "interval": "auto" runs it for
every interval-shaped call and says so; forcing it where it cannot run says why; other calls keep
their paths ("tiled" is the chunk loop); and the kernel path equals the PyTorch path
(ATTNLAB_KERNEL=0) on the same calls."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.errors import AttnlabError
from attnlab.ops import kernels
from attnlab.ops.api import attention_with_weights
from interval_cases import isa_params, need_compiler

from helpers import assert_close, qkv, spy_backends


@pytest.fixture(autouse=True)
def _kernel():
    need_compiler()
    if not kernels.available():
        pytest.fail(f"the interval kernel did not build: {kernels.status().reason}")


def sel(L, S=None, **kw):
    q, k, v = qkv(1, 2, 2, L, S or L, 8)
    return attnlab.select_backend(q, k, v, **kw)


@pytest.mark.parametrize("kw", [
    {"is_causal": True},
    {"mask": masks.sliding_window(8)},
    {"mask": masks.causal("bottom_right")},
    {"mask": masks.document(torch.arange(64) // 10) & masks.causal()},
    {"mask": masks.prefix_lm(5)},
    {"mask": masks.padding(key_lengths=[40])},
    {"softcap": 30.0},
    {"alibi_slopes": torch.tensor([0.5, 0.25])},
    {"return_lse": True},
])
def test_auto_names_the_kernel_for_interval_calls(kw):
    plain_causal = "is_causal" in kw or repr(kw.get("mask")).startswith("causal")
    c = sel(128 if plain_causal else 64, **kw)  # small top-left causal calls go to SDPA
    assert c.backend == "interval" and "interval kernel" in c.reason
    assert kernels.status().isa in c.reason


def test_a_call_reads_no_file_to_pick_and_name_the_build(monkeypatch):
    """The CPU's flags are read once per process and the build's source hash only when it
    loads: a call (its reason names the ISA) reads neither."""
    from attnlab.ops.kernels import build

    attnlab.attention(*qkv(1, 2, 2, 64, 64, 8), is_causal=True)  # loaded, flags read

    def refuse(*a, **k):
        raise AssertionError("a file read on the call path")

    monkeypatch.setattr(build, "build_key", refuse)
    monkeypatch.setattr(build.Path, "read_text", refuse)
    c = sel(64, mask=masks.sliding_window(8))
    assert build.chosen_isa() in c.reason
    q, k, v = qkv(1, 2, 2, 64, 64, 8)
    attnlab.attention(q, k, v, mask=masks.sliding_window(8))


@pytest.mark.parametrize("kw, name", [
    ({}, "sdpa"),  # no mask: PyTorch's fused kernel
    ({"mask": ~masks.causal()}, "sdpa"),  # not intervals: the old rule (small -> dense)
    ({"attn_mask": torch.ones(64, 64, dtype=torch.bool)}, "sdpa"),
    ({"mask": masks.sliding_window(8), "dropout_p": 0.1}, "sdpa"),
])
def test_other_calls_keep_their_paths(kw, name):
    c = sel(64, **kw)
    assert c.backend == name and "interval kernel" not in c.reason


def test_off_switch_restores_the_old_choice(monkeypatch):
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")
    assert "interval kernel" not in sel(64, mask=masks.sliding_window(8)).reason


def test_forced_interval_runs_the_kernel_and_tiled_the_loop(monkeypatch):
    from attnlab.ops import tiled
    from attnlab.ops.kernels import kernel

    calls = []
    real, loop = kernel.IntervalAttention.apply, tiled.TiledAttention.apply
    monkeypatch.setattr(kernel.IntervalAttention, "apply",
                        lambda *a, **kw: calls.append("kernel") or real(*a, **kw))
    monkeypatch.setattr(tiled.TiledAttention, "apply",
                        lambda *a, **kw: calls.append("loop") or loop(*a, **kw))
    q, k, v = qkv(1, 2, 2, 50, 50, 8)
    a = attnlab.attention(q, k, v, mask=masks.sliding_window(5), backend="interval")
    assert calls == ["kernel"]
    b = attnlab.attention(q, k, v, mask=masks.sliding_window(5), backend="tiled")
    assert calls == ["kernel", "loop"]
    assert_close(a, b, atol=1e-5)
    attnlab.attention(q, k, v, mask=~masks.causal(), backend="tiled")  # not intervals
    assert calls == ["kernel", "loop", "loop"]


@pytest.mark.parametrize("kw, says", [
    ({"mask": ~masks.causal()}, r"^mask: .*one interval; ~causal"),
    ({"attn_mask": torch.ones(50, 50, dtype=torch.bool)}, r"^attn_mask: .*one interval"),
    ({"mask": masks.causal(), "dropout_p": 0.1}, r"^dropout_p: .*no dropout; got 0.1"),
    ({"score_mod": lambda s, b, h, i, j: s}, r"^score_mod: .*Python function"),
    ({"dtype": torch.float64}, r"^dtype: .*float32, float16, bfloat16; got float64"),
    ({"env": "0"}, r'^backend: "interval" is turned off \(ATTNLAB_KERNEL=0\)'),
])
def test_forced_interval_where_it_cannot_run_says_why(monkeypatch, kw, says):
    kw = dict(kw)
    if "env" in kw:
        monkeypatch.setenv("ATTNLAB_KERNEL", kw.pop("env"))
    q, k, v = qkv(1, 2, 2, 50, 50, 8, dtype=kw.pop("dtype", torch.float32))
    with pytest.raises(AttnlabError, match=says):
        attnlab.attention(q, k, v, backend="interval", **kw)
    attnlab.attention(q, k, v, backend="tiled", **kw)  # the loop runs all of them


CALLS = [
    ((2, 4, 2, 97, 97, 40), dict(is_causal=True)),
    ((2, 4, 1, 70, 130, 32), dict(mask=masks.causal("bottom_right") & masks.padding([100, 60]))),
    ((1, 4, 4, 128, 128, 64), dict(mask=masks.document(torch.arange(128) // 33) & masks.causal(),
                                   softcap=20.0)),
    ((2, 2, 2, 60, 60, 16), dict(mask=masks.prefix_lm([7, 0]),
                                 alibi_slopes=torch.tensor([0.5, 0.1]))),
    ((1, 2, 2, 33, 50, 16), dict(mask=masks.sliding_window(9, "bottom_right"))),
]


@pytest.mark.parametrize("shape, kw", CALLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_path_equals_the_pytorch_path(monkeypatch, shape, kw, dtype):
    B, H, Hkv, L, S, D = shape
    q, k, v = qkv(B, H, Hkv, L, S, D, dtype=dtype, seed=L, requires_grad=True)

    def run():
        out, lse = attnlab.attention(q, k, v, enable_gqa=Hkv != H, return_lse=True, **kw)
        (out.float().square().sum() + lse.float().nan_to_num(0, 0, 0).sum()).backward()
        grads = [x.grad.clone() for x in (q, k, v)]
        for x in (q, k, v):
            x.grad = None
        return out, lse, grads

    assert "interval kernel" in attnlab.select_backend(
        q, k, v, enable_gqa=Hkv != H, return_lse=True, **kw).reason
    got = run()
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")
    want = run()
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    assert_close(got[0], want[0], atol=tol, rtol=tol, what="out")
    fin = torch.isfinite(want[1])
    assert torch.equal(fin, torch.isfinite(got[1]))
    assert_close(got[1][fin], want[1][fin], atol=tol, rtol=tol, what="lse")
    for name, a, b in zip("qkv", got[2], want[2]):
        assert_close(a, b, atol=5 * tol, rtol=5 * tol, what=f"d{name}")


@pytest.mark.parametrize("shape", [(20, 8), (3, 20, 8), (2, 3, 2, 20, 8)])
def test_any_rank_of_input(shape):
    q, k, v = (torch.randn(shape) for _ in range(3))
    m = masks.sliding_window(4)
    if len(shape) == 5:  # a per-batch mask along the last batch dim
        m = m & masks.padding(key_lengths=[20, 5, 11])
    got = attnlab.attention(q, k, v, mask=m)
    assert got.shape == q.shape
    assert_close(got, attnlab.attention(q, k, v, mask=m, backend="math"), atol=1e-5)


def test_choice_runs_the_kernel_once(monkeypatch):
    ran = spy_backends(monkeypatch)
    q, k, v = qkv(1, 2, 2, 40, 40, 8)
    attnlab.attention(q, k, v, mask=masks.sliding_window(4))
    assert ran == ["interval"]


def test_a_call_asks_for_the_kernel_and_its_intervals_once(monkeypatch):
    """The dispatcher's three questions share one answer per call, and is_causal=True is one
    mask whose intervals the next call of the same size reuses (a small call's overhead)."""
    from attnlab.masks.base import Mask

    asked, computed = [], []
    real_available, real_compute = kernels.available, Mask._compute_intervals
    monkeypatch.setattr(kernels, "available", lambda *a: asked.append(1) or real_available(*a))
    monkeypatch.setattr(Mask, "_compute_intervals",
                        lambda self, *a: computed.append(1) or real_compute(self, *a))
    q, k, v = qkv(1, 2, 2, 100, 100, 8)  # above dispatch.SMALL_CAUSAL: the interval kernel
    want = attnlab.attention(q, k, v, is_causal=True, backend="math")
    for _ in range(3):
        assert_close(attnlab.attention(q, k, v, is_causal=True), want, atol=1e-6)
    assert 1 <= len(asked) <= 3 and len(computed) <= 1  # the cheap path asks once


@pytest.mark.parametrize("isa", isa_params())
def test_weights_from_the_kernels_lse_sum_to_one(monkeypatch, isa):
    """The kernel scales the product q·k after the dot, as the score pipeline does: weights
    recomputed from its lse (attention_with_weights) sum to 1 as closely as on the PyTorch path,
    even with large logits (with q pre-scaled they were 12x further off: a BERT layer's rows),
    on every build (the scalar one rounds its multiply-adds once, as FMA hardware does)."""
    monkeypatch.setenv("ATTNLAB_KERNEL_ISA", isa)
    q, k, v = qkv(2, 4, 4, 40, 40, 32, seed=3)
    q, k = q * 4, k * 4  # logits ~ ±20
    m = masks.padding(key_lengths=[40, 31])
    assert "interval kernel" in attnlab.select_backend(q, k, v, mask=m, return_lse=True).reason

    def off():
        _, w = attention_with_weights(q, k, v, mask=m)
        return float((w.double().sum(-1) - 1).abs().max())

    got = off()
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")
    want = off()
    assert got <= 2 * want + 1e-7, f"row sums off by {got:.2e}, PyTorch path {want:.2e}"


def _spy(monkeypatch):
    """Counts of kernel runs and of separate NaN/Inf passes over whole inputs."""
    from attnlab.ops import nonfinite
    from attnlab.ops.kernels import kernel

    n = {"runs": 0, "checks": 0}
    apply, check = kernel.IntervalAttention.apply, nonfinite.all_finite

    def counted_apply(*a, **kw):
        n["runs"] += 1
        return apply(*a, **kw)

    def counted_check(x):
        n["checks"] += 1
        return check(x)

    monkeypatch.setattr(kernel.IntervalAttention, "apply", counted_apply)
    monkeypatch.setattr(nonfinite, "all_finite", counted_check)
    return n


@pytest.mark.parametrize("backend", ["auto", "interval"])
def test_the_kernel_checks_its_inputs_as_it_reads_them(monkeypatch, backend):
    """Finite inputs: one kernel run and no separate pass over q, k or v."""
    n = _spy(monkeypatch)
    q, k, v = qkv(1, 2, 2, 90, 90, 16)
    attnlab.attention(q, k, v, mask=masks.sliding_window(7), backend=backend)
    assert n == {"runs": 1, "checks": 0}


@pytest.mark.parametrize("where, row", [("key", 40), ("key", 80), ("value", 40), ("query", 40)])
def test_poison_the_kernel_reads_is_cleaned_and_computed_again(monkeypatch, where, row):
    """A NaN the kernel reads (a key anywhere, a value or query row it reads) sends the call to
    the cleaning path: a second run whose result keeps the poison local (nonfinite.py)."""
    n = _spy(monkeypatch)
    q, k, v = qkv(1, 2, 2, 90, 90, 16)
    m = masks.sliding_window(7) & masks.padding(key_lengths=[75])  # keys 75.. read by no row
    {"key": k, "value": v, "query": q}[where][0, 0, row, 3] = float("nan")
    out = attnlab.attention(q, k, v, mask=m, backend="interval")
    assert n["runs"] == 2 and n["checks"] > 0
    want = attnlab.attention(q, k, v, mask=m, backend="math")
    assert torch.equal(out.isnan(), want.isnan())
    assert_close(out.nan_to_num(), want.nan_to_num(), atol=1e-5)


def test_a_value_no_row_reads_needs_no_check_and_leaves_gradients_finite(monkeypatch):
    """A NaN value in a key vector's lanes past every row's keys (keys 35..39 of a padded call,
    sharing a vector with keys 32..34) is not read by the forward: one run, and the backward's
    dS there is exactly 0 (not 0·NaN), so every gradient equals the one with the value zeroed."""
    n = _spy(monkeypatch)
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 2, 40, 40, 16))
    with torch.no_grad():
        v[0, :, 37] = float("nan")
    m = masks.padding(key_lengths=[35])
    out = attnlab.attention(q, k, v, mask=m, backend="interval")
    assert n["runs"] == 1 and bool(torch.isfinite(out).all())
    out.square().sum().backward()
    fq, fk, fv = (t.detach().nan_to_num().requires_grad_() for t in (q, k, v))
    attnlab.attention(fq, fk, fv, mask=m, backend="math").square().sum().backward()
    for name, g, w in (("dq", q.grad, fq.grad), ("dk", k.grad, fk.grad), ("dv", v.grad, fv.grad)):
        assert bool(torch.isfinite(g).all()), name
        assert_close(g, w, atol=1e-5, what=name)
