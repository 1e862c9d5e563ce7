"""Measure the numbers the cost model runs on, on the group itself: link bandwidth and per-message
latency (two tiers when the ranks form groups of U), and attention compute.

    >>> cal = attnlab.distributed.calibrate()                     # doctest: +SKIP
    >>> cp.plan(65536, 8, 8, 64, cal.world, mask=m, calibration=cal).choice
    >>> cp.context_parallel_attention(q, k, v, calibration=cal)   # "auto" on measured numbers

Link: every rank exchanges a message with a peer (it sends one and receives one at the same
time, as the ring does) at two sizes, `small` and `large` bytes, `repeats` times each after a
warm-up; with t(s) the least time of one exchange of s bytes (a busy machine only adds time),
t(s) = latency + s / bandwidth, so

    bandwidth = (large − small) / (t(large) − t(small)),   latency = t(small) − small / bandwidth

(when noise leaves t(large) within 10% of t(small): bandwidth = large / t(large)).

The inter tier pairs rank r with rank r + U (mod P), another group; the intra tier with the next
rank of its own group of U (without groups, one tier: the next rank). Compute: the forward and
backward of `attnlab.attention` on a (1, H, L, D) block with no mask, in the accumulation dtype
of the call's inputs — rate = 3.5 · 4·H·L²·D / time (the model's fwd + bwd FLOPs) — and again
under a sliding window of `window` keys on a (1, H, 4·window, D) block (`masked_tflops` =
3.5 · 4·H·D · attended pairs / time:
the rate per attended pair of a block the mask cuts, as the engine runs it, which is what the
model prices a PARTIAL block at, `blockcost`). Every rank measures; all take the slowest rank's
numbers (one all-gather), so every rank plans alike.

Caution: a calibration is a snapshot of a machine that may be shared: run it where and when the
job runs. Gloo over loopback measures memory copies, not a network.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from attnlab.distributed import comm
from attnlab.errors import AttnlabError

TAG = 31


@dataclass(frozen=True)
class Calibration:
    """Measured numbers for `plan(..., calibration=)` and `context_parallel_attention`."""

    inter_gbps: float  # link between groups (all of it, without groups), Gbit/s each way
    intra_gbps: float  # link inside a group of ulysses_size ranks, Gbit/s each way
    latency_us: float  # per message, µs (the larger of the tiers')
    tflops: float  # attention forward + backward throughput per rank, TFLOP/s
    world: int
    backend: str
    ulysses_size: int | None = None
    #: the same under a sliding window, counting only the pairs it attends (what a block the
    #: mask cuts costs per attended pair on the engine)
    masked_tflops: float | None = None

    @property
    def link_gbps(self) -> float:
        return self.inter_gbps

    def describe(self) -> str:
        tiers = (f"link {self.intra_gbps:.3g} Gbit/s inside groups of {self.ulysses_size}, "
                 f"{self.inter_gbps:.3g} between" if self.ulysses_size
                 else f"link {self.inter_gbps:.3g} Gbit/s")
        masked = (f" ({self.masked_tflops:.3g} per attended pair under a window)"
                  if self.masked_tflops is not None else "")
        return (f"{tiers}, {self.latency_us:.3g} µs per message, {self.tflops:.3g} TFLOP/s"
                f"{masked} per rank ({self.backend}, {self.world} ranks)")


def _exchange_s(x: torch.Tensor, y: torch.Tensor, peer_out: int, peer_in: int, group) -> float:
    ex = comm.Exchange(group, "calibrate")
    ex.send(x, peer_out, TAG)  # (s,) uint8 -> peer: s bytes
    ex.recv(y, peer_in, TAG)  # (s,) uint8 <- peer: s bytes
    t0 = time.perf_counter()
    ex.post().wait()
    return time.perf_counter() - t0


def _sync(group, device) -> None:
    """A tiny all-gather: every rank starts the next measurement together."""
    world = comm.rank_world(group)[1]
    part = torch.zeros(1, device=device)
    comm.all_gather(part.new_empty(world), part, group, "calibrate")


def _tier(group, rank: int, world: int, step: int, within: int, sizes, repeats: int, device):
    """(bandwidth B/s, latency s) to the rank `step` ahead (inside blocks of `within` ranks)."""
    base = rank - rank % within
    out, inn = base + (rank - base + step) % within, base + (rank - base - step) % within
    times = []
    for s in sizes:
        x, y = torch.zeros(s, dtype=torch.uint8, device=device), torch.empty(
            s, dtype=torch.uint8, device=device)
        ts = []
        for i in range(repeats + 1):
            _sync(group, device)
            t = _exchange_s(x, y, out, inn, group)
            if i:  # the first is the warm-up
                ts.append(t)
        times.append(min(ts))  # the least disturbed run: a shared machine only adds time
    (s1, s2), (t1, t2) = sizes, times
    # noise can make the difference vanish; the large message alone then bounds the bandwidth
    bw = (s2 - s1) / (t2 - t1) if t2 > t1 + 0.1 * t2 else s2 / t2
    return bw, max(t1 - s1 / bw, 0.0)


def _compute_rate(H: int, L: int, D: int, dtype, device, repeats: int,
                  window: int | None = None) -> float:
    """FLOP/s of attnlab.attention's forward + backward on a (1, H, L, D) block: with no mask
    over its whole area, or under a sliding window of `window` keys counting only the pairs it
    attends (as the engine runs a block the mask cuts)."""
    from attnlab import masks
    from attnlab.ops import attention

    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(1, H, L, D, generator=g, dtype=dtype).to(device).requires_grad_()
               for _ in range(3))
    m = None if window is None else masks.sliding_window(window)
    pairs = L * L if m is None else attended(m, L)
    ts = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        attention(q, k, v, mask=m).sum().backward()
        if i:
            ts.append(time.perf_counter() - t0)
    return 3.5 * 4 * H * D * pairs / statistics.median(ts)


def attended(m, L: int) -> int:
    """(query, key) pairs an L × L mask without batch or heads lets attend, from its per-row
    intervals where it has them, else counted on its rows × columns."""
    got = m.intervals(L, L)
    if got is not None:
        lo, hi = got  # (1, 1, L) each: keys lo ≤ j < hi
        return int((hi.long() - lo.long()).clamp(min=0).sum())
    idx = torch.arange(L)
    return int(m.block(idx, idx, L, L).sum())


def calibrate(group=None, *, ulysses_size: int | None = None, small: int = 4096,
              large: int = 32 << 20, repeats: int = 5, block: tuple[int, int, int] = (4, 1024, 64),
              window: int = 512, dtype=torch.float32, device=None) -> Calibration:
    """Measure link, latency and compute on `group` (every rank must call it); see the module.

    ulysses_size: U, ranks of a group for strategy "hybrid": measure the link inside groups of U
        consecutive ranks and the one between them. small / large: the two message sizes,
        bytes. block: (H, L, D) of the timed attention block. window: keys of the sliding
        window `masked_tflops` is measured under, on 4·window positions of H heads of D (the
        nearer the windows the job runs, the better it prices them). dtype: the blocks' dtype
        (fp32 for fp32 / bf16 / fp16 inputs, whose blocks accumulate in fp32; fp64 for fp64).
    """
    rank, world = comm.rank_world(group)
    if ulysses_size is not None and (isinstance(ulysses_size, bool)
                                     or not isinstance(ulysses_size, int)
                                     or ulysses_size < 1 or world % ulysses_size):
        raise AttnlabError(f"ulysses_size: expected a positive divisor of world = {world}, "
                           f"got {ulysses_size!r}")
    for name, v in (("small", small), ("large", large), ("repeats", repeats)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise AttnlabError(f"{name}: expected a positive int, got {v!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise AttnlabError(f"window: expected a positive int, got {window!r}")
    if large <= small:
        raise AttnlabError(f"large: expected more bytes than small = {small}, got {large}")
    if not isinstance(block, (tuple, list)) or len(block) != 3 or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in block):
        raise AttnlabError(f"block: expected (H, L, D), three positive ints, got {block!r}")
    device = torch.device("cpu") if device is None else torch.device(device)
    U = ulysses_size or 1
    lat = []
    inter = intra = float("inf")
    if world > 1:
        if world // U > 1:  # to the same member of the next group
            inter, li = _tier(group, rank, world, U, world, (small, large), repeats, device)
            lat.append(li)
        if U > 1:
            intra, la = _tier(group, rank, world, 1, U, (small, large), repeats, device)
            lat.append(la)
        inter = intra if world // U == 1 else inter
        intra = inter if U == 1 else intra
    rate = _compute_rate(*block, dtype, device, repeats)
    H, _, D = block
    masked = _compute_rate(H, 4 * window, D, dtype, device, repeats, window=window)
    mine = torch.tensor([inter, intra, max(lat, default=0.0), rate, masked], dtype=torch.float64)
    every = mine.new_empty(world * 5)
    if world > 1:
        comm.all_gather(every, mine, group, "calibrate")  # (P·5,) float64: every rank's numbers
    else:
        every = mine
    return slowest(every.view(world, 5), comm.backend(group), ulysses_size)


def slowest(every: torch.Tensor, backend: str, ulysses_size: int | None) -> Calibration:
    """The Calibration every rank plans with, from every rank's (inter B/s, intra B/s, latency s,
    FLOP/s, masked FLOP/s), a (P, 5) table: the slowest rank's number of each (the least
    bandwidths and rates, the largest latency): a step waits for its slowest rank."""
    world = every.shape[0]
    slow_inter, slow_intra = float(every[:, 0].min()), float(every[:, 1].min())
    if world == 1:  # no link: the model's communication terms are zero anyway
        slow_inter = slow_intra = float("inf")
    return Calibration(inter_gbps=slow_inter * 8 / 1e9, intra_gbps=slow_intra * 8 / 1e9,
                       latency_us=float(every[:, 2].max()) * 1e6,
                       tflops=float(every[:, 3].min()) / 1e12,
                       masked_tflops=float(every[:, 4].min()) / 1e12, world=world,
                       backend=backend, ulysses_size=ulysses_size)


def calibrate_worker(rank: int, world: int, ulysses_size: int | None = None,
                     threads: int | None = None) -> Calibration:
    """`spawn(calibrate_worker, P)`: a calibration of P local processes (`plan-cp --calibrate`)."""
    if threads:
        torch.set_num_threads(threads)
    return calibrate(ulysses_size=ulysses_size)
