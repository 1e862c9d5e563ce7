"""A calibration is what the cost model plans with: `plan(..., calibration=)` equals the plan on
its numbers, two tiers price the hybrid's all-to-alls and ring apart, one process measures compute
alone, and `attnlab plan-cp --calibrate` plans on what it measured. (Measuring on a group of 4,
and "auto" running its pick, is in test_scale.py.)"""

import dataclasses
import math

import pytest

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
                                     (dict(ulysses_size=0), "ulysses_size")])
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


def test_measured_masked_rate_prices_the_block_path_by_tile_area():
    """With masked_tflops, ring and allgather compute the area of their FULL tiles at tflops and
    of their PARTIAL tiles at masked_tflops (a window of 512 in chunks of 2048: whole diagonal
    tiles), ulysses the attended pairs; without it, all three the attended pairs."""
    from attnlab.distributed.blockcost import block_areas
    from attnlab.distributed.geometry import Geometry

    cal = dataclasses.replace(CAL, masked_tflops=0.01)
    m = masks.sliding_window(512)
    p = cp.plan(8192, 8, 8, 64, 2, mask=m, dtype="fp32", calibration=cal)
    full, part = block_areas(Geometry(8192, 8192, 2, "zigzag", m))
    assert full == [0.0, 0.0]  # zigzag chunks of 2048: every live tile is cut by the window
    # rank 0 (chunks 0, 3): tiles (0,0), (3,2), (3,3); rank 1 (1, 2): (1,0), (1,1), (2,1), (2,2)
    assert part == [2048.0 * 2048 * 3, 2048.0 * 2048 * 4]
    per = 2 * 8 * 128 * 3.5
    assert p["ring"].compute_s == pytest.approx(per * part[1] / 0.01e12)
    assert p["ulysses"].compute_s == pytest.approx(3.5 * max(p["ulysses"].flops_fwd) / 0.02e12)
    assert p["ring"].compute_s > 4 * p["ulysses"].compute_s
    q = cp.plan(8192, 8, 8, 64, 2, mask=m, dtype="fp32", calibration=CAL)  # no masked rate
    assert q["ring"].compute_s == pytest.approx(3.5 * max(q["ring"].flops_fwd) / 0.02e12)


def test_causal_diagonal_tiles_count_half_at_the_unmasked_rate():
    from attnlab.distributed.blockcost import block_areas
    from attnlab.distributed.geometry import Geometry

    full, part = block_areas(Geometry(8192, 8192, 2, "zigzag", masks.causal()))
    c = 2048.0 * 2048
    assert part == [0.0, 0.0]
    # rank 0: (3, 0..2) and the diagonals (0, 0), (3, 3); rank 1: (1, 0), (2, 0..1), (1, 1), (2, 2)
    assert full == [c * (3 + 2 * 0.5)] * 2
