"""The public kernel API (`attnlab.ops.kernels.interval_*`) refuses bad arguments with one
AttnlabError naming the argument and showing the value or shapes, before any kernel runs; and a
row with nothing to attend (lo >= hi, any values) attends nothing."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab import AttnlabError
from attnlab.ops import kernels
from interval_cases import need_compiler

B, H, L, S, D = 1, 2, 5, 6, 8


def args(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, D, generator=g, dtype=dtype) for n in (L, S, S))
    lo = torch.zeros(B, H, L, dtype=torch.int64)
    hi = torch.full((B, H, L), S, dtype=torch.int64)
    return q, k, v, lo, hi


@pytest.mark.parametrize("kw, needles", [
    (dict(scale="x"), ["scale:", "'x'"]),
    (dict(scale=math.nan), ["scale:", "nan"]),
    (dict(scale=math.inf), ["scale:", "inf"]),
    (dict(scale=None), ["scale:", "None"]),
    (dict(softcap=math.inf), ["softcap:", "inf"]),
    (dict(softcap="big"), ["softcap:", "'big'"]),
    (dict(alibi="abc"), ["alibi:", "'abc'"]),
    (dict(alibi=[0.5, math.nan]), ["alibi:", "nan"]),
    (dict(alibi=[0.5, 0.25, 0.1]), ["alibi:", "got (3)", "(H,) = (2,)"]),
    (dict(q_pos0=1.5), ["q_pos0:", "1.5"]),
    (dict(k_pos0="3"), ["k_pos0:", "'3'"]),
])
@pytest.mark.parametrize("fn", ["interval_forward", "interval_attention", "interval_weights"])
def test_bad_modifiers_are_named(fn, kw, needles):
    q, k, v, lo, hi = args()
    kw = {"scale": 0.5, **kw}
    call = getattr(kernels, fn)
    with pytest.raises(AttnlabError) as e:
        if fn == "interval_weights":
            call(q, k, torch.zeros(B, H, L), lo, hi, **kw)
        else:
            call(q, k, v, lo, hi, **kw)
    for n in needles:
        assert n in str(e.value), str(e.value)


@pytest.mark.parametrize("which", ["k", "v"])
def test_mixed_dtypes_are_refused(which):
    q, k, v, lo, hi = args()
    k = k.half() if which == "k" else k
    v = v.bfloat16() if which == "v" else v
    with pytest.raises(AttnlabError, match=f"{which}: expected q's dtype torch.float32, got"):
        kernels.interval_forward(q, k, v, lo, hi, scale=0.5)


@pytest.mark.parametrize("name, shape", [("out", (B, H, L, D + 1)), ("lse", (B, H, L, 1)),
                                         ("dout", (B, H, L - 1, D)), ("dlse", (B, H))])
def test_backward_shapes_are_checked(name, shape):
    q, k, v, lo, hi = args()
    t = {"out": torch.zeros(B, H, L, D), "lse": torch.zeros(B, H, L),
         "dout": torch.zeros(B, H, L, D), "dlse": None}
    t[name] = torch.zeros(shape)
    with pytest.raises(AttnlabError) as e:
        kernels.interval_backward(q, k, v, lo, hi, t["out"], t["lse"], t["dout"], t["dlse"],
                                  scale=0.5)
    msg = str(e.value)
    assert msg.startswith(f"{name}: expected") and str(shape).replace(",)", ")") in msg, msg


def test_an_empty_row_with_huge_bounds_attends_nothing():
    """lo = 2**32 >= hi: the row is empty; an unchecked int32 cast made lo 0 (keys [0, hi))."""
    need_compiler()
    q, k, v, lo, hi = args()
    lo[0, 0, 1], hi[0, 0, 1] = 2**32, 3
    lo[0, 1, 2], hi[0, 1, 2] = 2**33 + 1, 2**33
    out, lse = kernels.interval_forward(q, k, v, lo, hi, scale=0.5)
    assert bool((out[0, 0, 1] == 0).all()) and lse[0, 0, 1] == -math.inf
    assert bool((out[0, 1, 2] == 0).all()) and lse[0, 1, 2] == -math.inf
    assert bool(torch.isfinite(lse[0, 0, [0, 2, 3, 4]]).all())
