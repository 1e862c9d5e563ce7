"""The kernel's glue reductions (run on its own work queue, not PyTorch's OpenMP): `all_finite`
finds one NaN/Inf anywhere (every SIMD lane, chunk edge and tail) and never mistakes a sum that
overflows for one; `row_dot` is the backward's rowsum(dO ∘ O); `nonfinite.all_finite` uses them
once the kernel is loaded, on every build this CPU runs."""

from __future__ import annotations

import pytest
import torch

from attnlab.ops import nonfinite
from attnlab.ops.kernels import build
from interval_cases import OFF_CPU, isa_params, masks_left_changed, need_compiler

N = 3 * (1 << 16) + 21  # three work items and a tail that fills no SIMD register


@pytest.fixture(params=isa_params())
def ops(request):
    need_compiler()
    got = build.get(request.param)
    assert got is not None, build.status().reason
    return got


@pytest.mark.parametrize("at", [0, 7, 15, (1 << 16) - 1, 1 << 16, N - 22, N - 1])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_all_finite_finds_one_bad_value_anywhere(ops, at, bad):
    x = torch.randn(N)
    assert ops.all_finite(x)
    x[at] = bad
    assert not ops.all_finite(x)


def test_all_finite_is_not_fooled_by_an_overflowing_sum(ops):
    x = torch.full((N,), 3e38)  # finite values whose sum is inf
    assert not bool(torch.isfinite(x.sum()))
    assert ops.all_finite(x) and ops.all_finite(torch.zeros(0))


@pytest.mark.parametrize("n", [1, 15, 64, 111])
def test_row_dot_is_the_rowwise_dot_product(ops, n):
    a, b = torch.randn(2, 3, 97, n), torch.randn(2, 3, 97, n)
    want = (a.double() * b.double()).sum(-1)
    got = ops.row_dot(a, b)
    assert got.shape == (2, 3, 97)
    torch.testing.assert_close(got.double(), want, atol=1e-5 * n ** 0.5, rtol=1e-5)


@pytest.mark.parametrize("n", [1, 15, 64])
def test_row_dot_reads_any_strides_in_place(ops, n):
    """Rows of every head, transposed rows, and one value expanded (the gradient of a sum)."""
    base = torch.randn(2, 3, 120, n)
    b = torch.randn(2, 3, 97, n)
    cases = [base[:, :, 5:102],  # a row range of every head
             torch.randn(2, n, 3, 97).permute(0, 2, 3, 1),  # element stride != 1
             torch.tensor(0.75).expand(2, 3, 97, n),  # one value, every stride 0
             torch.randn(2, 1, 97, 1).expand(2, 3, 97, n)]  # one value per row
    for a in cases:
        want = (a.double() * b.double()).sum(-1)
        for x, y in ((a, b), (b, a)):
            got = ops.row_dot(x, y)
            torch.testing.assert_close(got.double(), want, atol=1e-5 * n ** 0.5, rtol=1e-5)


def test_nonfinite_check_uses_the_loaded_kernel(monkeypatch):
    need_compiler()
    ops = build.get()
    calls = []
    monkeypatch.setattr(build, "loaded", lambda: calls.append(1) or ops)
    x = torch.randn(1, 2, 4096, 8)
    assert nonfinite.all_finite(x) and calls
    x[0, 1, 4095, 7] = float("nan")
    assert not nonfinite.all_finite(x)
    assert nonfinite.all_finite(x[..., :4])  # not contiguous: PyTorch's reduction
    assert not nonfinite.all_finite(x.double())


@OFF_CPU
def test_the_queues_helpers_put_back_the_cpus_they_kept_off():
    """run_items' helpers (every pass of the kernel and its glue) keep off the caller's CPU while
    they work and then put their CPU masks back, as the decode kernel's do."""
    need_compiler()
    ops = build.get(None)
    assert ops is not None, build.status().reason
    x = torch.randn(1 << 22)  # 16 MiB: helpers are woken
    assert masks_left_changed(lambda: ops.all_finite(x)) == {}
