"""The kernel's large buffers come from a cache of freed blocks (csrc/pool.h): a freed output
serves the next call of the same size, reused (dirty) memory never leaks into results, the cache
can be turned off, and a Python dispatch mode (a memory ledger) still sees every tensor."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from attnlab.distributed.ledger import TensorLedger
from attnlab.ops import kernels
from interval_cases import formula, intervals, need_compiler

# (B, H, L, D): an output of 4 MiB (the pool serves 1 MiB and more)
B, H, L, D = 1, 4, 4096, 64


def _call(seed: int, kind: str = "causal"):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g) for _ in range(3))
    lo, hi = intervals(kind, B, L, L)
    return (q, k, v, lo, hi), kernels.interval_forward(q, k, v, lo, hi, scale=D ** -0.5)


def test_freed_outputs_serve_the_next_calls_and_dirty_memory_never_shows():
    need_compiler()
    _, (out, _) = _call(0, "full")
    ptrs = {out.data_ptr()}
    out.fill_(float("nan"))  # the next call must overwrite every element
    del out
    assert kernels.cached_bytes() >= B * H * L * D * 4
    for seed in (1, 2, 3):
        # rows with no key are written 0, not left as they were
        args, (out, _) = _call(seed, "empty_rows")
        ptrs.add(out.data_ptr())
        ref, _ = formula(*(x.double() for x in args[:3]), args[3], args[4], scale=D ** -0.5)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-4)
        out.fill_(float("nan"))
        del out
    # out and the keys-last copy trade the same two blocks
    assert len(ptrs) <= 2, ptrs


def test_the_pool_can_be_turned_off():
    need_compiler()
    code = ("import torch; from attnlab.ops import kernels\n"
            "q = torch.randn(1, 4, 4096, 64); lo = torch.zeros(1, 1, 4096, dtype=torch.long)\n"
            "out = kernels.interval_forward(q, q, q, lo, lo + 4096, scale=0.125)[0]\n"
            "del out; print(kernels.cached_bytes())\n")
    for flag, cached in (("0", False), ("1", True)):
        env = {**os.environ, "ATTNLAB_KERNEL_POOL": flag}
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        assert (int(res.stdout.split()[-1]) > 0) == cached, (flag, res.stdout)


def test_a_dispatch_mode_sees_the_kernels_large_tensors():
    need_compiler()
    _call(0)  # built, and a block cached
    with TensorLedger() as ledger:
        _call(0)
    # q, k, v (3 x 4 MiB) plus the kernel's keys-last copy and out (4 MiB each)
    assert ledger.peak >= 5 * B * H * L * D * 4, ledger.at_peak[:6]


def test_zeros_come_from_the_pool_and_are_zeros():
    need_compiler()
    assert kernels.available()
    z = kernels.zeros(B, H, L, D, dtype=torch.float32)
    ptr = z.data_ptr()
    z.fill_(float("nan"))  # a dirty block back to the pool
    del z
    z = kernels.zeros(B, H, L, D, dtype=torch.float32)
    assert z.data_ptr() == ptr and z.shape == (B, H, L, D) and z.is_contiguous()
    assert int(torch.count_nonzero(z)) == 0
    small = kernels.zeros(3, 5, dtype=torch.float32)  # below the pool's size: glibc's, zeros too
    assert torch.equal(small, torch.zeros(3, 5))
    wide = kernels.zeros(2, 3, dtype=torch.float64)  # not the kernel's dtype: torch.zeros
    assert wide.dtype == torch.float64 and torch.equal(wide, torch.zeros(2, 3, dtype=torch.float64))
