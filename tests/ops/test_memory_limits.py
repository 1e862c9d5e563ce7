"""Dense paths past the memory limit are refused before allocating, with the bytes needed and the
path that fits; the limit is min(4 GiB, half the physical memory) or ATTNLAB_MAX_DENSE_BYTES."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks
from attnlab.ops import budget, weights

from helpers import wrap_backends

BIG = 65536


@pytest.fixture
def no_backend(monkeypatch):
    """Any backend that starts computing fails the test: refusal must come first."""
    def boom(p, need_lse):
        raise AssertionError("the backend ran: the limit did not refuse before allocating")
    wrap_backends(monkeypatch, lambda name, f: boom)
    monkeypatch.delenv(budget.ENV, raising=False)


def big_qkv(D=4):
    return (torch.randn(1, 1, BIG, D) for _ in range(3))


@pytest.mark.parametrize("backend,kw", [
    ("math", {}),
    ("math", {"mask": masks.sliding_window(256)}),
    ("reference", {}),
    ("reference", {"mask": masks.sliding_window(256)}),
    ("sdpa", {"mask": masks.sliding_window(256)}),
    ("sdpa", {"softcap": 30.0}),
])
def test_forced_dense_backend_refused_at_64k(no_backend, backend, kw):
    q, k, v = big_qkv()
    with pytest.raises(AttnlabError) as info:
        attnlab.attention(q, k, v, backend=backend, **kw)
    msg = str(info.value)
    assert msg.startswith("backend: ") and f'"{backend}"' in msg
    assert "GiB" in msg and "(1, 1, 65536, 65536)" in msg and 'backend="tiled"' in msg
    assert budget.ENV in msg


def test_weights_for_all_rows_refused_at_64k(no_backend, monkeypatch):
    q, k, _ = big_qkv()
    lse = torch.zeros(1, 1, BIG)
    monkeypatch.setattr(weights, "_allowed", lambda *a: pytest.fail("computed before refusing"))
    with pytest.raises(AttnlabError, match=r"^rows: .*GiB.*rows=slice"):
        attnlab.attention_weights(q, k, lse, mask=masks.sliding_window(256))


def test_what_fits_still_runs_at_64k(monkeypatch):
    monkeypatch.delenv(budget.ENV, raising=False)
    q, k, v = big_qkv()
    assert attnlab.select_backend(q, k, v, mask=masks.sliding_window(256)).backend in (
        "interval", "tiled")  # both linear in L
    w = attnlab.attention_weights(q, k, torch.zeros(1, 1, BIG), rows=[0, 65535],
                                  mask=masks.sliding_window(256))
    assert w.shape == (1, 1, 2, BIG)


def test_default_limit(monkeypatch):
    monkeypatch.delenv(budget.ENV, raising=False)
    phys = budget.physical_memory()
    assert budget.limit() == min(4 * 2**30, phys // 2 if phys else 4 * 2**30)


def test_env_var_sets_the_limit(monkeypatch):
    q, k, v = (torch.randn(1, 2, 128, 8) for _ in range(3))  # 32768 score entries
    monkeypatch.setenv(budget.ENV, "100000")
    for backend in ("math", "reference"):
        with pytest.raises(AttnlabError, match=r"over the limit of 97.7 KiB"):
            attnlab.attention(q, k, v, backend=backend)
    assert attnlab.attention(q, k, v, backend="tiled").shape == q.shape
    assert attnlab.attention(q, k, v, backend="sdpa").shape == q.shape  # no mask: fused, linear
    monkeypatch.setenv(budget.ENV, "inf")
    assert attnlab.attention(q, k, v, backend="math").shape == q.shape
    monkeypatch.setenv(budget.ENV, "lots")
    with pytest.raises(AttnlabError, match=budget.ENV):
        attnlab.attention(q, k, v, backend="math")
