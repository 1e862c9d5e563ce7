"""Suite-wide settings."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tests use small tensors: one intra-op thread is many times faster than several on a busy
    2-core machine (thread hand-off costs more than the work)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
