"""A calibration is what the cost model plans with: `plan(..., calibration=)` equals the plan on
its numbers, two tiers price the hybrid's all-to-alls and ring apart, one process measures compute
alone, and `attnlab plan-cp --calibrate` plans on what it measured. (Measuring on a group of 4,
and "auto" running its pick, is in test_scale.py.)"""

import dataclasses
import math

import pytest
import torch

import attnlab.distributed as cp
from attnlab import masks
from attnlab.cli import main
from attnlab.errors import AttnlabError

CAL = cp.Calibration(inter_gbps=8.0, intra_gbps=40.0, latency_us=300.0, tflops=0.02, world=4,
                     backend="gloo", ulysses_size=2)


def test_plan_on_a_calibration_is_the_plan_on_its_numbers():
    kw = dict(mask=masks.sliding_window(512), dtype="fp32", ulysses_size=2)
    a = cp.plan(8192, 8, 8, 64, 4, calibration=CAL, **kw)
    b = cp.plan(8192, 8, 8, 64, 4, link_gbps=8.0, intra_gbps=40.0, latency_us=300.0,
                tflops=0.02, **kw)
    assert a.estimates == b.estimates and a.choice == b.choice
    c = cp.plan(8192, 8, 8, 64, 4, **kw)  # the defaults: a datacenter link and chip
    assert c["ring"].compute_s < a["ring"].compute_s / 1000


def test_calibration_says_what_it_measured():
    assert CAL.link_gbps == 8.0
    assert "40 Gbit/s inside groups of 2, 8 between" in CAL.describe()
    with pytest.raises(dataclasses.FrozenInstanceError):
        CAL.tflops = 1.0


def test_one_process_measures_compute_and_no_link():
    cal = cp.calibrate(small=256, large=4096, repeats=1, block=(1, 32, 8))
    assert cal.world == 1 and cal.tflops > 0 and math.isinf(cal.inter_gbps)
    p = cp.plan(256, 2, 2, 8, 1, calibration=cal)
    assert p["ring"].comm_s == 0


@pytest.mark.parametrize("kw, msg", [(dict(small=0), "small"), (dict(large=10, small=20), "large"),
                                     (dict(ulysses_size=0), "ulysses_size"),
                                     (dict(window=0), "window")])
def test_calibrate_rejects_bad_arguments(kw, msg):
    with pytest.raises(AttnlabError, match=msg):
        cp.calibrate(**kw)


def test_cli_plan_cp_calibrate(monkeypatch, capsys):
    """--calibrate measures on local processes (here: their answer stood in) and plans on it."""
    calls = []

    def fake_spawn(fn, world, *args, **kw):
        calls.append((fn.__name__, world, args))
        return [CAL] * world

    monkeypatch.setattr(cp, "spawn", fake_spawn)
    assert main(["plan-cp", "--L", "8192", "--num-heads", "8", "--head-dim", "64", "--world", "4",
                 "--mask", "sliding:512", "--dtype", "fp32", "--ulysses-size", "2",
                 "--calibrate", "--calibrate-world", "4"]) == 0
    out = capsys.readouterr().out
    assert calls == [("calibrate_worker", 4, (2, 1))]
    assert "measured: link 40 Gbit/s inside groups of 2, 8 between, 300 µs per message" in out
    want = cp.plan(8192, 8, 8, 64, 4, mask=masks.sliding_window(512), dtype="fp32",
                   calibration=CAL, ulysses_size=2)
    assert f"- 4 ranks: {want.reason}" in out


def _exact_attended_per_rank(m, L, P):
    """Attended (query, key) pairs of each rank's zigzag rows, from the mask's intervals."""
    lo, hi = m.intervals(L, L)
    per_row = (hi.long() - lo.long()).sum(dim=(0, 1)).double() / (lo.shape[0] * lo.shape[1])
    c = L // (2 * P)  # zigzag: rank r holds chunks r and 2P − 1 − r
    return [float(per_row[r * c:(r + 1) * c].sum() + per_row[(2 * P - 1 - r) * c:
                                                              (2 * P - r) * c].sum())
            for r in range(P)]


DOCS = masks.document(torch.repeat_interleave(torch.arange(4),
                                               torch.tensor([1000, 2500, 700, 3992])))


@pytest.mark.parametrize("m", [masks.sliding_window(512), masks.sliding_window(3000), DOCS,
                               masks.causal() & DOCS],
                         ids=["window512", "window3000", "documents", "causal_documents"])
def test_partial_blocks_count_their_attended_pairs(m):
    """A chunk pair the mask cuts counts the pairs it attends (estimated on sub-tiles, within 5%
    of the exact count per rank), not its area."""
    from attnlab.distributed.blockcost import block_areas
    from attnlab.distributed.geometry import Geometry

    full, part = block_areas(Geometry(8192, 8192, 2, "zigzag", m))
    exact = _exact_attended_per_rank(m, 8192, 2)
    for f, p, e in zip(full, part, exact):
        assert f + p == pytest.approx(e, rel=0.05)


def test_window_block_compute_scales_with_the_window_not_the_chunk():
    """Sliding windows at L = 16384, P = 2 (zigzag chunks of 4096, every live pair cut by the
    window): with a measured masked rate the ring's and allgather's compute follow the window
    (×4 window: ×~3.9 time), far below the chunk² area; ulysses is priced on the same engine."""
    cal = dataclasses.replace(CAL, world=2, masked_tflops=0.01)
    est = {W: cp.plan(16384, 8, 8, 64, 2, mask=masks.sliding_window(W), dtype="fp32",
                      calibration=cal) for W in (256, 1024)}
    per = 2 * 8 * 128 * 3.5  # s·FLOP/s per pair: 2·H·(D + Dv), fwd + bwd
    for s in ("ring", "allgather", "ulysses"):
        ratio = est[1024][s].compute_s / est[256][s].compute_s
        assert 3.5 < ratio < 4.2, (s, ratio)
    # rank 1 (chunks 1, 2) holds the tiles (1,0), (1,1), (2,1), (2,2): whole area 4 · 4096²
    whole = per * 4 * 4096.0**2 / 0.01e12
    attended = per * 2 * 4096 * 1024 / 0.01e12  # 8192 rows × ~1024 keys
    assert est[1024]["ring"].compute_s == pytest.approx(attended, rel=0.05)
    assert est[1024]["ring"].compute_s < whole / 3
    both = est[1024]
    assert both["ulysses"].compute_s == pytest.approx(
        per * 16384 * 1024 / 2 / 0.01e12, rel=0.05)  # all rows, half the heads
    no_rate = cp.plan(16384, 8, 8, 64, 2, mask=masks.sliding_window(1024), dtype="fp32",
                      calibration=dataclasses.replace(cal, masked_tflops=None))
    assert no_rate["ring"].compute_s == pytest.approx(
        3.5 * max(no_rate["ring"].flops_fwd) / 0.02e12)  # the attended FLOPs at tflops


def test_calibration_measures_a_window_counting_attended_pairs(monkeypatch):
    """masked_tflops is timed on a sliding window of `window` keys over 4·window positions, and
    counts the pairs the window attends (a causal band: W·n − W(W−1)/2)."""
    import attnlab.ops
    from attnlab.distributed.calibrate import attended

    seen = []
    real = attnlab.ops.attention

    def spy(q, k, v, *a, mask=None, **kw):
        seen.append((q.shape[-2], mask))
        return real(q, k, v, *a, mask=mask, **kw)

    monkeypatch.setattr(attnlab.ops, "attention", spy)
    cal = cp.calibrate(repeats=1, block=(1, 32, 8), window=8)
    assert cal.masked_tflops > 0 and "per attended pair under a window" in cal.describe()
    windows = [(n, m) for n, m in seen if m is not None]
    assert windows and all(n == 32 and m.size == 8 for n, m in windows)
    assert attended(masks.sliding_window(8), 32) == 8 * 32 - 8 * 7 // 2
    doc = masks.document(torch.repeat_interleave(torch.arange(2), torch.tensor([5, 11])))
    assert attended(doc, 16) == 5 * 5 + 11 * 11


def test_causal_diagonal_tiles_count_half_at_the_unmasked_rate():
    from attnlab.distributed.blockcost import block_areas
    from attnlab.distributed.geometry import Geometry

    full, part = block_areas(Geometry(8192, 8192, 2, "zigzag", masks.causal()))
    c = 2048.0 * 2048
    assert part == [0.0, 0.0]
    # rank 0: (3, 0..2) and the diagonals (0, 0), (3, 3); rank 1: (1, 0), (2, 0..1), (1, 1), (2, 2)
    assert full == [c * (3 + 2 * 0.5)] * 2


@pytest.mark.parametrize("block", [(4, 0, 64), (4, 1024), (4, 1.5, 64), (0, 8, 8), "big"])
def test_calibrate_rejects_a_bad_block(block):
    """block=(4, 0, 64) timed nothing and reported 0 TFLOP/s."""
    with pytest.raises(AttnlabError, match=r"block: expected \(H, L, D\)"):
        cp.calibrate(block=block)


FAST = (4e9, 4e9, 1e-5, 5e12, 2e12)  # inter B/s, intra B/s, latency s, FLOP/s, masked FLOP/s
SLOW = (1e9, 2e9, 3e-5, 1e12, 5e11)


@pytest.mark.parametrize("me", [0, 1])
def test_every_rank_plans_with_the_slowest_ranks_numbers(monkeypatch, me):
    """calibrate on a group of 2 ranks of different speed (the group stood in for: this rank
    measures FAST, its peer SLOW): the bandwidths and rates are the slower rank's, the latency
    the larger, whichever rank is slow."""
    import importlib

    cal_mod = importlib.import_module("attnlab.distributed.calibrate")  # the module, not the fn
    monkeypatch.setattr(cal_mod.comm, "rank_world", lambda group: (me, 2))
    monkeypatch.setattr(cal_mod, "_tier", lambda *a: (FAST[0], FAST[2]))
    monkeypatch.setattr(cal_mod, "_compute_rate",
                        lambda *a, window=None: FAST[3] if window is None else FAST[4])
    gathered = []

    def all_gather(out, part, group, phase):
        rows = [part.tolist(), list(SLOW)] if me == 0 else [list(SLOW), part.tolist()]
        out.copy_(torch.tensor(rows, dtype=torch.float64).reshape(-1))
        gathered.append(part.tolist())

    monkeypatch.setattr(cal_mod.comm, "all_gather", all_gather)
    cal = cp.calibrate(repeats=1)
    assert gathered == [[FAST[0], FAST[0], FAST[2], FAST[3], FAST[4]]]
    assert cal.tflops == pytest.approx(SLOW[3] / 1e12)
    assert cal.masked_tflops == pytest.approx(SLOW[4] / 1e12)
    assert cal.inter_gbps == pytest.approx(SLOW[0] * 8 / 1e9)
    assert cal.latency_us == pytest.approx(SLOW[2] * 1e6)
    assert cal.world == 2


def test_ulysses_size_without_hybrid_is_refused():
    """ulysses_size with strategy "ring" (or "allgather", "ulysses") was silently ignored."""
    q = torch.randn(1, 2, 8, 4)
    for strategy in ("ring", "allgather", "ulysses"):
        with pytest.raises(AttnlabError, match="ulysses_size: only strategy 'hybrid'"):
            cp.context_parallel_attention(q, q, q, strategy=strategy, ulysses_size=1)
    cp.context_parallel_attention(q, q, q, strategy="auto", ulysses_size=1)
    handle = cp.ContextParallel(None, "zigzag", "auto", ulysses_size=1)
    handle.attention(q, q, q, strategy="ring")  # the handle's U is for the strategies using it
