"""The catalogue's context-parallel sweep: every mask of tests/catalog.py through the ring's
blocks on every layout, each rank emulated in one process (`distributed.attend`'s forward_block /
backward_block over the blocks a ring rank receives, as tests/distributed/test_kernel_blocks.py
walks them), against one-process attention: out, lse, dq, dk, dv.

float64 runs every block on the pair loop (the interval kernel takes fp32/bf16/fp16 only), fp32
runs interval-shaped blocks as whole kernel calls (`kernel_block`); a sample is quick, the rest
slow. The strategies other than the ring and the cross-rank checks run in spawned groups
(test_exact.py and the others here)."""

from __future__ import annotations

import pytest
import torch

import attnlab
import catalog
from attnlab.distributed import attend
from attnlab.distributed.attend import Call
from attnlab.distributed.geometry import Geometry
from distributed import catalog_cases

B, H, Hkv, D = 2, 4, 2, 8
L = 61  # not a multiple of 2 or 3: uneven shards, zigzag chunks of different sizes

def _blocks(g: Geometry, r: int, k, v):
    """[(k block, v block, key positions, pieces)] of rank r in ring order: its own shard, then
    each source's rows that r needs, as the ring sends them."""
    out = []
    for s in [r] + [(r - t) % g.world for t in range(1, g.world)]:
        pos = g.k.positions(s)
        ks, vs = (x[:, :, pos] for x in (k, v))
        if s == r:
            out.append((ks, vs, pos, g.k.pieces(r)))
        elif g.count_needed(r, s):
            rows = g.rows_needed(r, s)
            out.append((ks[:, :, rows], vs[:, :, rows], pos[rows], g.received_pieces(r, s)))
    return out


def ring(q, k, v, mask, layout: str, world: int, dout, dlse):
    """(out, lse, dq, dk, dv) over the whole sequence, assembled from `world` emulated ranks."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    g = Geometry(L, L, world, layout, mask)
    out, lse = torch.zeros(B, H, L, D, dtype=acc), torch.zeros(B, H, L, dtype=acc)
    dq, dk, dv = (torch.zeros(x.shape, dtype=acc) for x in (q, k, v))
    for r in range(world):
        c = Call(g, None, r, world, D ** -0.5, None, acc)
        qpos = g.q.positions(r)
        q_r = q[:, :, qpos].contiguous()
        state = attend.start_state(c, q_r, D)
        blocks = _blocks(g, r, k, v)
        for kb, vb, _, pieces in blocks:
            attend.forward_block(c, state, q_r, kb, vb, pieces)
        st = state.ready() and state
        out[:, :, qpos], lse[:, :, qpos] = st.out, st.lse
        saved = (q_r.to(acc), st.out, st.lse, dout[:, :, qpos].to(acc), dlse[:, :, qpos].to(acc))
        dq_r = torch.zeros(q_r.shape, dtype=acc)
        for kb, vb, kpos, pieces in blocks:
            gk, gv = attend.backward_block(c, saved, dq_r, kb.clone(), vb.clone(), pieces)
            dk[:, :, kpos] += gk
            dv[:, :, kpos] += gv
        dq[:, :, qpos] = dq_r
    return out, lse, dq, dk, dv


AXES = {"case": catalog.MASKS, "layout": list(catalog.CP_LAYOUTS), "world": [2, 3],
        "dtype": [torch.float64, torch.float32]}
QUICK = catalog.covering(AXES, seed=3)
_SEEN = {catalog.case_id(d) for d in QUICK}
SLOW = [d for d in catalog.product(AXES) if catalog.case_id(d) not in _SEEN]


PARAMS = ([pytest.param(d, id=catalog.case_id(d)) for d in QUICK]
          + [pytest.param(d, id=catalog.case_id(d), marks=pytest.mark.slow) for d in SLOW])


@pytest.mark.parametrize("combo", PARAMS)
def test_ring_blocks_equal_one_process(combo):
    case, layout, world, dtype = combo["case"], combo["layout"], combo["world"], combo["dtype"]
    g = torch.Generator().manual_seed(7)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q64, k64, v64 = mk(B, H, L, D), mk(B, Hkv, L, D), mk(B, Hkv, L, D)
    dout, dlse = mk(B, H, L, D), mk(B, H, L)
    mask = case.build(B, H, L, L).for_call(B, H)  # as the op binds it to the call
    q, k, v = (t.to(dtype).requires_grad_(True) for t in (q64, k64, v64))
    want, want_lse = attnlab.attention(q, k, v, mask=mask, enable_gqa=True, backend="math",
                                       return_lse=True)
    dead = torch.isneginf(want_lse)
    want_g = torch.autograd.grad([want, want_lse], (q, k, v),
                                 [dout.to(dtype), dlse.to(dtype).masked_fill(dead, 0.0)])
    got = ring(*(t.detach() for t in (q, k, v)), mask, layout, world, dout,
               dlse.masked_fill(dead, 0.0))
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, (want, want_lse, *want_g)):
        a, b = a.double(), b.detach().double()
        assert torch.equal(torch.isneginf(a), torch.isneginf(b)), name
        fin = torch.isfinite(b)
        scale = max(1.0, float(b[fin].abs().max())) if fin.any() else 1.0
        err = float((a[fin] - b[fin]).abs().max()) / scale if fin.any() else 0.0
        assert err <= tol, f"{name}: relative error {err:.3e}"


# -- every strategy, spawned -------------------------------------------------------------------

SPAWNED = catalog_cases.cases()
def _spawned_params(slow: bool):
    return [pytest.param(c, id=c["id"]) for c in SPAWNED if c["slow"] == slow]


@pytest.fixture(scope="module")
def spawned_quick():
    from distributed.catalog_cases import run_catalog

    return _spawned(run_catalog, False)


@pytest.fixture(scope="module")
def spawned_slow():
    from distributed.catalog_cases import run_catalog

    return _spawned(run_catalog, True)


def _spawned(fn, slow: bool) -> dict:
    from distributed.harness import run_group

    out: dict = {}
    for per_rank in run_group(fn, 4, slow, timeout_s=900.0):
        for cid, res in per_rank.items():
            out.setdefault(cid, []).append(res)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("c", _spawned_params(False))
def test_every_strategy_equals_one_process(c, spawned_quick):
    _check(c, spawned_quick)


@pytest.mark.slow
@pytest.mark.parametrize("c", _spawned_params(True))
def test_every_strategy_equals_one_process_all(c, spawned_slow):
    _check(c, spawned_slow)


def _check(c, results):
    per_rank = results[c["id"]]
    assert len(per_rank) == c["P"]
    for rank, r in enumerate(per_rank):
        assert "error" not in r, f"rank {rank}:\n{r['error']}"
        if "refused" in r:
            assert catalog_cases.may_refuse(c), f"rank {rank} refused: {r['refused']}"
            assert "per-head mask" in r["refused"]
            continue
        for what in ("out", "lse", "dq", "dk", "dv"):
            assert r[what] <= 1e-10, f"rank {rank} {what}: relative error {r[what]:.3e}"
