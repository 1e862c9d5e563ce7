"""The kernel's exp and tanh (csrc/vec.h: vexp, vtanh) against float64 on a dense grid, on every
ISA build, through the build's own code (the `math_probe` op): the error bounds vec.h states, the
underflow edge (below EXP_FLOOR exactly 0, never a denormal; just above it a normal float within
the bound), and what -inf and NaN give."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.ops.kernels import build
from interval_cases import isa_params, need_compiler

EXP_FLOOR = np.float32(-87.3)  # csrc/vec.h
#: measured maxima (4 December 2026): vexp 1.013 ulp (AVX-512, AVX2: the Cephes polynomial) and
#: 0.502 (scalar: the C library's exp) over the grid below and a 1-in-64 sample of every float in
#: [-87.3, 0); vtanh 3.832 (AVX-512, AVX2) and 3.578 (scalar), over every float of [0.125, 0.25),
#: where 1 - e^(-2|x|) cancels
VEXP_ULP = {"avx512": 1.05, "avx2": 1.05, "scalar": 0.55}
VTANH_ULP = {"avx512": 3.9, "avx2": 3.9, "scalar": 3.65}


def ulps(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|got - exact| in units of the float32 spacing at the float32 nearest exact."""
    step = np.spacing(np.abs(exact.astype(np.float32))).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / step


def probe(isa: str, x: torch.Tensor, fn: int) -> np.ndarray:
    need_compiler()
    return build.load(isa).math_probe(x.contiguous(), fn).numpy()


def _f32(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a, dtype=np.float32))


@pytest.mark.parametrize("isa", isa_params())
def test_vexp_within_its_bound_from_the_floor_to_zero(isa):
    """What the kernel feeds it: s - max <= 0, down to the floor (every float in the last
    binades above it too)."""
    bits = np.array([EXP_FLOOR]).view(np.int32)[0]
    edge = (bits - np.arange(4096, dtype=np.int32)).view(np.float32)  # the floor, then upwards
    above = EXP_FLOOR + np.arange(0, 20000, dtype=np.float32) * np.float32(1e-5)
    x = np.concatenate([np.linspace(EXP_FLOOR, 0, 1 << 19, dtype=np.float32),
                        -np.logspace(-30, 0, 1 << 14, dtype=np.float32), above, edge, [0.0]])
    x = x.astype(np.float32)
    got = probe(isa, _f32(x), 0)
    exact = np.exp(x.astype(np.float64))
    assert (got >= np.finfo(np.float32).tiny).all(), "a denormal or 0 above the floor"
    err = ulps(got, exact)
    assert err.max() <= VEXP_ULP[isa], f"{err.max():.3f} ulp at x = {x[err.argmax()]!r}"


@pytest.mark.parametrize("isa", isa_params())
def test_vexp_flushes_below_the_floor_to_exact_zero(isa):
    below = np.nextafter(EXP_FLOOR, np.float32(-np.inf))
    x = _f32([below, -87.5, -88.7, -103.9, -1e30, -np.inf, np.nan])
    got = probe(isa, x, 0)
    assert (got == 0).all() and not np.signbit(got).any(), got  # NaN too: the inputs are checked
    at = probe(isa, _f32([EXP_FLOOR]), 0)  # the floor itself is kept: a normal float
    assert at[0] >= np.finfo(np.float32).tiny
    assert ulps(at, np.exp(np.float64([EXP_FLOOR])))[0] <= VEXP_ULP[isa]


@pytest.mark.parametrize("isa", isa_params())
def test_vtanh_within_its_bound(isa):
    tiny = np.logspace(-30, 0, 1 << 14, dtype=np.float32)
    bits = np.array([0.125], dtype=np.float32).view(np.int32)[0]
    near = (bits + np.arange(1 << 23, dtype=np.int32)).view(np.float32)  # all of [0.125, 0.25)
    x = np.concatenate([np.linspace(-20, 20, 1 << 19, dtype=np.float32), tiny, -tiny, near,
                        -near[::64], [0.0, 1e4, -1e4, np.inf, -np.inf]]).astype(np.float32)
    got = probe(isa, _f32(x), 1)
    exact = np.tanh(x.astype(np.float64))
    err = ulps(got, exact)
    assert err.max() <= VTANH_ULP[isa], f"{err.max():.3f} ulp at x = {x[err.argmax()]!r}"
    assert got[x == 0][0] == 0 and abs(got[-1]) == 1 and abs(got[-2]) == 1
