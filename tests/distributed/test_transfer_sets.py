"""Transfer sets are exact where tiles are not 1 × 1: for striped layouts and `&` / `|` / `~`
masks at L = 257, 300, 512 (tiles of 3-4 positions, PARTIAL tiles refined by evaluating the
mask), every rank receives exactly the keys of every other rank that some of its queries may
attend, by the dense mask; and the bytes the plan counts are those of exactly those keys."""

import pytest
import torch

import attnlab.distributed as cp
from attnlab import masks
from attnlab.distributed.geometry import Geometry
from distributed.harness import make_mask

KINDS = ("sliding", "combo", "window_or_prefix", "not_window", "window_and_doc")


def _geometry(kind, L, P, layout):
    mask, is_causal = make_mask(kind, L, 2)
    m = cp.cost.effective_mask(mask, is_causal)
    return Geometry(L, L, P, layout, m), m


@pytest.mark.parametrize("layout", ["striped", "zigzag", "contiguous"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("L", [257, 300, 512])
def test_transfer_sets_are_exact(L, P, kind, layout):
    g, m = _geometry(kind, L, P, layout)
    assert g.key_block == 1
    dense = m.to_dense(L, L).flatten(0, 1).any(0)  # (L, S): some batch/head may attend
    for r in range(P):
        for s in range(P):
            need = dense[g.q.positions(r)][:, g.k.positions(s)].any(0)  # (S_s,)
            got = torch.zeros_like(need)
            got[g.rows_needed(r, s)] = True
            assert torch.equal(got, need), (r, s, int(got.sum()), int(need.sum()))
            assert g.count_needed(r, s) == int(need.sum())


@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("L", [257, 300, 512])
def test_striped_window_moves_only_the_window(L, P):
    """Striped sliding window W: rank r needs of rank s only keys within W − 1 of its rows —
    here every key (W > P), but the plan's bytes are exactly count × row bytes."""
    W = 5
    g = Geometry(L, L, P, "striped", masks.sliding_window(W))
    est = cp.plan(L, 1, 1, 8, P, mask=masks.sliding_window(W), layout="striped",
                  dtype=torch.float64)
    row = 1 * 1 * (8 + 8) * 8
    for r in range(P):
        want = sum(g.count_needed(r, s) for s in range(P) if s != r)
        assert est["ring"].fwd_recv[r] == want * row
