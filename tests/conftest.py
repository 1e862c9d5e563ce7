"""Suite-wide settings and the fixtures several directories share."""

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


@pytest.fixture(autouse=True)
def seeded():
    """Every test draws the same random numbers whichever tests ran before it (a tolerance that a
    test meets must not depend on the order or selection of the suite)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(0)
    yield
    torch.random.set_rng_state(state)


@pytest.fixture(scope="session")
def minilm():
    """The packaged all-MiniLM-L6-v2 running on attnlab (`load_model(None)`: a LoadedModel with
    .model, .tokenizer, .special_tokens). Needs the hf extra: without it the test fails."""
    from attnlab.explain.model import load_model

    return load_model(None)
