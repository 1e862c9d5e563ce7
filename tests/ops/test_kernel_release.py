"""kernels.release_cached hands the pool's freed blocks back to the system (what a large
context-parallel call does between its steps, distributed.attend.settle)."""

import pytest
import torch

from attnlab.ops import kernels


def test_release_cached_empties_the_pool_down_to_keep():
    if not kernels.available():
        pytest.skip("the kernel is not available here")
    kernels.release_cached()
    blocks = [kernels.zeros(1, 4, 4096, 64, dtype=torch.float32) for _ in range(3)]  # 4 MiB
    del blocks
    assert kernels.cached_bytes() >= 3 * 4 << 20
    assert kernels.release_cached(keep_bytes=4 << 20) >= 2 * 4 << 20
    assert 0 < kernels.cached_bytes() <= 4 << 20
    kernels.release_cached()
    assert kernels.cached_bytes() == 0
