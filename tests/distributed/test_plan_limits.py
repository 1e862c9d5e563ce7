"""`plan` on tile classes: it never builds a per-position structure (a structural check, no
timing), and sizes beyond what it plans in a few seconds are refused with the limit named."""

import dataclasses

import pytest
import torch

import attnlab.distributed as cp
from attnlab import masks
from attnlab.cli import main
from attnlab.distributed import cost
from attnlab.distributed.layouts import Sharding
from attnlab.errors import AttnlabError

FACTORIES = ("arange", "zeros", "ones", "empty", "full", "tensor")


@pytest.fixture
def largest_tensor(monkeypatch):
    """The largest numel any torch factory call made while the test ran; per-position helpers
    of the layouts refuse to run at all."""
    seen = [0]
    for name in FACTORIES:
        real = getattr(torch, name)

        def spy(*a, _real=real, **k):
            out = _real(*a, **k)
            seen[0] = max(seen[0], out.numel())
            return out

        monkeypatch.setattr(torch, name, spy)

    def refuse(self, *a, **k):
        raise AssertionError(f"per-position structure built for n = {self.n}")

    monkeypatch.setattr(Sharding, "positions", refuse)
    monkeypatch.setattr(Sharding, "pieces", refuse)
    monkeypatch.setattr(Sharding, "owner_order", refuse)
    return seen


@pytest.mark.parametrize("layout", ["zigzag", "contiguous", "striped"])
@pytest.mark.parametrize("mask", ["causal", "window", "window_or_prefix"])
def test_plans_one_million_over_64_without_per_position_structures(layout, mask,
                                                                   largest_tensor):
    L, P = 1 << 20, 64
    m = {"causal": None, "window": masks.sliding_window(4096),
         "window_or_prefix": masks.sliding_window(512) | masks.prefix_lm(64)}[mask]
    p = cp.plan(L, 32, 8, 128, P, mask=m, is_causal=True, layout=layout)
    assert p.choice in cost.STRATEGIES and len(p["ring"].fwd_sent) == P
    assert largest_tensor[0] <= 1 << 22 <= L * P // 16  # tiles and P × P counts, never L·P


@pytest.mark.parametrize("mask", ["window", "window_or_prefix", "documents"])
def test_calibrated_plan_prices_partial_blocks_on_sub_tiles(mask, largest_tensor):
    """With a measured masked rate, PARTIAL blocks are priced on sub-tiles of the chunk grid:
    still no per-position structure and no tensor past 2^22 elements at L = 1M, P = 64."""
    L, P = 1 << 20, 64
    m = {"window": masks.sliding_window(4096),
         "window_or_prefix": masks.sliding_window(512) | masks.prefix_lm(64),
         "documents": masks.document(torch.arange(L) * 16 // L)}[mask]
    cal = cp.Calibration(inter_gbps=100.0, intra_gbps=100.0, latency_us=10.0, tflops=100.0,
                         world=P, backend="nccl", masked_tflops=50.0)
    p = cp.plan(L, 32, 8, 128, P, mask=m, is_causal=True, calibration=cal)
    q = cp.plan(L, 32, 8, 128, P, mask=m, is_causal=True, calibration=dataclasses.replace(
        cal, masked_tflops=100.0))
    assert p["ring"].compute_s > q["ring"].compute_s  # the PARTIAL blocks' rate counts
    assert largest_tensor[0] <= 1 << 22


def test_plans_past_two_to_the_31_on_tiles(largest_tensor):
    p = cp.plan(3 << 30, 8, 8, 128, 16, is_causal=True)
    assert p["ring"].load <= 1.05 and largest_tensor[0] <= 1 << 22


@pytest.mark.parametrize("kw, needles", [
    (dict(L=10**12), ["L: plan handles sequences of at most 4,294,967,296", "10^12"]),
    (dict(world=4096), ["world: plan handles at most 256 ranks", "4096"]),
    (dict(world=10**12), ["world: plan handles at most 256 ranks"]),
])
def test_sizes_beyond_the_limit_are_refused(kw, needles):
    args = dict(L=4096, H=8, Hkv=8, D=64, world=8) | kw
    with pytest.raises(AttnlabError) as e:
        cp.plan(args.pop("L"), args.pop("H"), args.pop("Hkv"), args.pop("D"), args.pop("world"))
    msg = str(e.value).replace("1,000,000,000,000", "10^12")
    for n in needles:
        assert n in msg, msg


@pytest.mark.parametrize("argv, needle", [
    (["--L", str(10**12)], "at most 4,294,967,296"),
    (["--L", "4096", "--world", "4096"], "at most 256 ranks"),
    (["--L", str(10**8), "--mask", "document:4"], "at most 16,777,216"),
])
def test_plan_cp_refuses_in_one_line(argv, needle, capsys):
    assert main(["plan-cp", "--num-heads", "8", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
