"""The cost model: bytes, FLOPs, load balance and time of each strategy, before running anything.

`plan(L, H, Hkv, D, world, ...)` gives, per strategy and per rank, the bytes sent and received in
the forward and the backward pass — the same numbers `comm.record()` logs when the call runs, and
the tests assert they are equal — plus the FLOPs from the mask's tile classes and the predicted
time on a link of `link_gbps` and a chip of `tflops`.

Formulas (e = bytes per element of the inputs, a = 4, or 8 for float64; n = padded shard length;
a key row is B·Hkv·(D + Dv) elements; c[r][s] = how many of rank s's keys rank r needs):

- ring: forward, rank r sends Σ_d c[d][r] key rows and receives Σ_s c[r][s], one message for k and
  one for v per peer with anything to move; backward the same again, plus the partial dK/dV rows
  (a) back the other way, two messages per peer.
- allgather, all ranks need all: forward (P−1)·n key rows in two all-gathers; backward the same
  again + (P−1)·n gradient rows (a) in two reduce-scatters. Otherwise the ring's transfers, all
  at once.
- ulysses: q, k, v (k and v with lcm(Hkv, P) heads: replicated when P does not divide Hkv), and
  out with lse side by side, each move (P−1)/P of their shard in one
  all-to-all each, forward; their gradients the same backward, the lse's always (zeros where a
  loss does not use it), so every loss sends the same.
- messages: a send is one; a collective counts P − 1 each way (as `comm` counts them).
- FLOPs: 2·B·H·(D + Dv) per attended (query, key) pair forward (4·B·H·L·S·D for a full square),
  backward 2.5× that; a FULL tile counts its area, a PARTIAL tile half.

Time: communication = bytes / link_gbps + messages × latency_us (the larger direction, on the
busiest rank); compute (the busiest rank) at tflops. The ring overlaps the two (time = the larger;
each step's transfers are posted before the step before computes); allgather and ulysses wait for
their transfers, so their time is the sum. Both are reported.

Caution: the time is a model, not a measurement; it ignores kernel efficiency at small blocks,
contention and the ring's per-step synchronisation. Bytes, messages and FLOPs are exact counts of
what the code does.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from attnlab.distributed.blockcost import block_compute_s, ulysses_compute_s
from attnlab.distributed.geometry import Geometry
from attnlab.distributed.grouped import GroupedGeometry
from attnlab.distributed.headrule import (
    hybrid_why_not,
    ulysses_kv_heads,
    ulysses_moved,
    ulysses_why_not,
)
from attnlab.distributed.layouts import check_layout
from attnlab.errors import AttnlabError
from attnlab.masks import Mask, causal

STRATEGIES = ("ring", "allgather", "ulysses", "hybrid")
#: what "auto" assumes when the call does not say: a datacenter link and chip
DEFAULT_LINK_GBPS, DEFAULT_TFLOPS = 100.0, 100.0
#: per-message latency, µs: a typical inter-node message over InfiniBand / RoCE (NCCL; a few µs
#: over NVLink within a node, tens of µs for gloo over TCP)
DEFAULT_LATENCY_US = 10.0
#: the largest sizes `plan` accepts: it plans on tile classes (a grid of about 2·world ×
#: MAX_KEY_BLOCKS tiles, never per position), in a few seconds and a few hundred MB up to these
MAX_PLAN_WORLD = 256
MAX_PLAN_LEN = 1 << 32
DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16,
          "fp16": torch.float16}


@dataclass(frozen=True)
class Estimate:
    """One strategy's predicted cost; lists have one entry per rank."""

    strategy: str
    feasible: bool
    why_not: str = ""
    fwd_sent: list[int] = field(default_factory=list)
    fwd_recv: list[int] = field(default_factory=list)
    bwd_sent: list[int] = field(default_factory=list)
    bwd_recv: list[int] = field(default_factory=list)
    flops_fwd: list[float] = field(default_factory=list)
    comm_s: float = 0.0  # forward + backward, busiest rank
    compute_s: float = 0.0  # forward + backward, busiest rank
    overlaps: bool = False
    fwd_msgs_sent: list[int] = field(default_factory=list)
    fwd_msgs_recv: list[int] = field(default_factory=list)
    bwd_msgs_sent: list[int] = field(default_factory=list)
    bwd_msgs_recv: list[int] = field(default_factory=list)
    latency_s: float = 0.0  # the part of comm_s that is messages × latency, busiest rank

    @property
    def load(self) -> float:
        """max / mean work over ranks (1.0 = perfectly balanced)."""
        mean = sum(self.flops_fwd) / max(len(self.flops_fwd), 1)
        return max(self.flops_fwd) / mean if mean > 0 else 1.0

    @property
    def time_s(self) -> float:
        """Predicted forward + backward time: overlapped where the strategy overlaps."""
        return max(self.comm_s, self.compute_s) if self.overlaps else self.serial_s

    @property
    def serial_s(self) -> float:
        return self.comm_s + self.compute_s

    def messages_per_rank(self) -> int:
        """Most forward + backward messages sent by any rank."""
        return max(a + b for a, b in zip(self.fwd_msgs_sent, self.bwd_msgs_sent)) \
            if self.fwd_msgs_sent else 0

    def bytes_per_rank(self) -> int:
        """Largest forward + backward bytes sent by any rank."""
        return max(a + b for a, b in zip(self.fwd_sent, self.bwd_sent)) if self.fwd_sent else 0


@dataclass(frozen=True)
class Plan:
    L: int
    S: int
    world: int
    layout: str
    mask: str
    estimates: dict[str, Estimate]
    choice: str
    reason: str

    def __getitem__(self, strategy: str) -> Estimate:
        return self.estimates[strategy]


@dataclass(frozen=True)
class StrategyChoice:
    strategy: str
    reason: str


def effective_mask(mask: Mask | None, is_causal: bool) -> Mask | None:
    if is_causal:
        return causal() if mask is None else causal() & mask
    return mask


def estimate(geom: Geometry, *, B: int, H: int, Hkv: int, D: int, Dv: int, dtype: torch.dtype,
             link_gbps: float, tflops: float, latency_us: float = 0.0,
             per_head_mask: bool = False,
             masked_tflops: float | None = None) -> dict[str, Estimate]:
    """Every strategy's Estimate for this geometry and these sizes; with `masked_tflops` (a
    calibration's), every strategy's compute is what the engine runs (`blockcost`): FULL areas
    at tflops, the attended pairs of PARTIAL blocks at masked_tflops."""
    P = geom.world
    e = torch.empty((), dtype=dtype).element_size()
    a = 8 if dtype == torch.float64 else 4
    row_e, row_a = B * Hkv * (D + Dv) * e, B * Hkv * (D + Dv) * a
    pairs = geom.work_pairs()
    flops = [2.0 * B * H * (D + Dv) * w for w in pairs]
    n = geom.k.n_max
    bw, rate, lat = link_gbps * 1e9 / 8, tflops * 1e12, latency_us * 1e-6
    zeros = [0] * P

    def make(name, fs, fr, bs, br, mfs, mfr, mbs, mbr, fl, overlaps):
        # per rank: the busier direction's bytes at bw, plus its messages at the latency
        per_rank = [max(fs[r] + bs[r], fr[r] + br[r]) / bw
                    + max(mfs[r] + mbs[r], mfr[r] + mbr[r]) * lat for r in range(P)]
        msgs = max(max(mfs[r] + mbs[r], mfr[r] + mbr[r]) for r in range(P))
        return Estimate(name, True, "", fs, fr, bs, br, fl, max(per_rank), 3.5 * max(fl) / rate,
                        overlaps, mfs, mfr, mbs, mbr, msgs * lat)

    out = {}
    # point to point: rank r sends the rows each other rank needs of its keys, once
    cnt = geom.count_matrix.clone()  # (P, P): cnt[r][s] keys of rank s that rank r needs
    cnt.fill_diagonal_(0)
    rows_out = cnt.sum(0).tolist()  # rows others fetch from r
    rows_in = cnt.sum(1).tolist()  # rows r fetches
    peers_out = (cnt > 0).sum(0).tolist()
    peers_in = (cnt > 0).sum(1).tolist()
    p2p = (
        [x * row_e for x in rows_out], [y * row_e for y in rows_in],
        # backward: the keys again, then each partial dK/dV back to its owner
        [x * row_e + y * row_a for x, y in zip(rows_out, rows_in)],
        [y * row_e + x * row_a for x, y in zip(rows_out, rows_in)],
        [2 * x for x in peers_out], [2 * y for y in peers_in],  # k and v: 2 messages a peer
        [2 * (x + y) for x, y in zip(peers_out, peers_in)],
        [2 * (x + y) for x, y in zip(peers_out, peers_in)])
    out["ring"] = make("ring", *p2p, flops, True)

    if P > 1 and geom.all_need_all:
        f = [(P - 1) * n * row_e] * P
        b = [(P - 1) * n * (row_e + row_a)] * P
        m = P - 1  # messages of one collective, each way
        out["allgather"] = make("allgather", f, f, b, b, [2 * m] * P, [2 * m] * P,
                                [4 * m] * P, [4 * m] * P, flops, False)
    else:
        out["allgather"] = make("allgather", *p2p, flops, False)

    blocks = None if masked_tflops is None else block_compute_s(
        geom, B=B, H=H, D=D, Dv=Dv, tflops=tflops, masked_tflops=masked_tflops)
    if blocks is not None:  # what the engine computes per block, at the two measured rates
        for s in ("ring", "allgather"):
            out[s] = replace(out[s], compute_s=blocks)
    why = ulysses_why_not(H, Hkv, P, per_head_mask)
    if why:
        out["ulysses"] = Estimate("ulysses", False, why)
    elif P == 1:
        out["ulysses"] = make("ulysses", *[zeros] * 8, flops, False)
    else:
        moved = ulysses_moved(B, H, ulysses_kv_heads(Hkv, P), D, Dv, geom.q.n_max, n, P, e, a)
        even = [sum(flops) / P] * P  # every rank runs all tokens of H/P heads
        m = [4 * (P - 1)] * P  # all-to-alls of q, k, v and out + lse; of their gradients
        out["ulysses"] = make("ulysses", [moved] * P, [moved] * P, [moved] * P, [moved] * P,
                              m, m, m, m, even, False)
    engine = None if masked_tflops is None or not out["ulysses"].feasible else ulysses_compute_s(
        geom, B=B, H=H, D=D, Dv=Dv, tflops=tflops, masked_tflops=masked_tflops)
    if engine is not None:  # the same engine over all positions, for H/P heads
        out["ulysses"] = replace(out["ulysses"], compute_s=engine)
    return out





@dataclass(frozen=True)
class HybridEstimate(Estimate):
    """An Estimate whose head all-to-alls (`a2a_s`, inside groups) wait, while its ring part
    (the rest of comm_s, across groups) overlaps compute."""

    a2a_s: float = 0.0
    ulysses_size: int = 1

    @property
    def time_s(self) -> float:
        return self.a2a_s + max(self.comm_s - self.a2a_s, self.compute_s)



def hybrid_estimate(geom: Geometry, *, B: int, H: int, Hkv: int, D: int, Dv: int, dtype,
                    U: int | None, intra_gbps: float, inter_gbps: float, tflops: float,
                    latency_us: float, per_head_mask: bool = False,
                    masked_tflops: float | None = None) -> Estimate:
    """Bytes, messages, FLOPs and time of strategy "hybrid" on every rank (rank r = g·U + j:
    member j of group g): the head all-to-alls over U ranks (each one's (U−1)/U of q, k, v, out
    with lse; their gradients backward) at intra_gbps, plus the ring over the R groups for H/U
    query heads and lcm(Hkv, U)/U key/value heads at inter_gbps."""
    P = geom.world
    why = hybrid_why_not(H, Hkv, P, U, per_head_mask)
    if why:
        return HybridEstimate("hybrid", False, why)
    R, K = P // U, ulysses_kv_heads(Hkv, U)
    e = torch.empty((), dtype=dtype).element_size()
    a = 8 if dtype == torch.float64 else 4
    geo = GroupedGeometry(geom.L, geom.S, R, geom.layout, geom.mask, U=U)
    ring = estimate(geo, B=B, H=H // U, Hkv=K // U, D=D, Dv=Dv, dtype=dtype,
                    link_gbps=inter_gbps, tflops=tflops, latency_us=latency_us,
                    masked_tflops=masked_tflops)["ring"]
    moved = ulysses_moved(B, H, K, D, Dv, geom.q.n_max, geom.k.n_max, U, e, a) if U > 1 else 0
    msgs = 4 * (U - 1)  # all-to-alls of q, k, v and out + lse; of their gradients
    of = [r // U for r in range(P)]  # the group (ring rank) of each rank

    def per_rank(xs, add):
        return [xs[g] + add for g in of]

    fs, fr = per_rank(ring.fwd_sent, moved), per_rank(ring.fwd_recv, moved)
    bs, br = per_rank(ring.bwd_sent, moved), per_rank(ring.bwd_recv, moved)
    mfs, mfr = per_rank(ring.fwd_msgs_sent, msgs), per_rank(ring.fwd_msgs_recv, msgs)
    mbs, mbr = per_rank(ring.bwd_msgs_sent, msgs), per_rank(ring.bwd_msgs_recv, msgs)
    lat = latency_us * 1e-6
    a2a = 2 * moved / (intra_gbps * 1e9 / 8) + 2 * msgs * lat  # forward + backward, waited on
    flops = [ring.flops_fwd[g] for g in of]
    return HybridEstimate("hybrid", True, "", fs, fr, bs, br, flops, a2a + ring.comm_s,
                          ring.compute_s, True, mfs, mfr, mbs, mbr,
                          2 * msgs * lat + ring.latency_s, a2a_s=a2a, ulysses_size=U)


#: predicted times within this factor of the best count as a tie, broken by fewer bytes
TIE = 1.05


def choose(estimates: dict[str, Estimate]) -> StrategyChoice:
    """The strategy with the least predicted time; among those within 5% of it, the one that
    sends the fewest bytes (the model ignores contention and per-step synchronisation, which
    favour fewer)."""
    ok = [e for e in estimates.values() if e.feasible]
    fastest = min(e.time_s for e in ok)
    near = [e for e in ok if e.time_s <= fastest * TIE]
    best = min(near, key=lambda e: (e.bytes_per_rank(), e.time_s, STRATEGIES.index(e.strategy)))
    others = ", ".join(
        f"{e.strategy} {_ms(e.time_s)}" if e.feasible else f"{e.strategy}: {e.why_not}"
        for e in estimates.values() if e is not best)
    how = "overlapped with" if best.overlaps else "then"
    tie = ("; within 5% of the fastest and sends the fewest bytes"
           if best.time_s > fastest else "")
    reason = (f"{best.strategy}: {_ms(best.time_s)} predicted (communication "
              f"{_ms(best.comm_s)} {how} compute {_ms(best.compute_s)}, "
              f"{best.bytes_per_rank() / 2**20:.1f} MiB sent per rank{tie}); vs {others}")
    return StrategyChoice(best.strategy, reason)


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms"


def plan(L: int, H: int, Hkv: int, D: int, world: int, *, mask: Mask | None = None,
         is_causal: bool = False, layout: str = "zigzag", dtype=torch.bfloat16, batch: int = 1,
         S: int | None = None, Dv: int | None = None, link_gbps: float = DEFAULT_LINK_GBPS,
         tflops: float = DEFAULT_TFLOPS, latency_us: float = DEFAULT_LATENCY_US,
         ulysses_size: int | None = None, intra_gbps: float | None = None,
         inter_gbps: float | None = None, calibration=None) -> Plan:
    """Predicted bytes, FLOPs, balance and time of every strategy for one attention call.

        >>> p = plan(4096, 8, 8, 64, 4, mask=masks.causal(), layout="zigzag")   # doctest: +SKIP
        >>> p["ring"].fwd_sent[0], p["ring"].load, p.choice

    ulysses_size: U, also plan strategy "hybrid" (groups of U consecutive ranks).
    intra_gbps / inter_gbps: two link tiers, inside a group of U ranks and between groups
        (default: link_gbps both); strategies over all P ranks run at inter_gbps.
    calibration: a `Calibration` (`attnlab.distributed.calibrate`): its measured link,
        latency, compute (and tiers) replace link_gbps, latency_us, tflops, intra/inter_gbps.
    """
    check_layout(layout)
    dtype = DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise AttnlabError(f"dtype: expected a float dtype or one of {sorted(DTYPES)}, "
                           f"got {dtype!r}")
    S = L if S is None else S
    Dv = D if Dv is None else Dv
    for name, v in (("L", L), ("S", S), ("H", H), ("Hkv", Hkv), ("D", D), ("Dv", Dv),
                    ("world", world), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise AttnlabError(f"{name}: expected a positive int, got {v!r}")
    if world > MAX_PLAN_WORLD:
        raise AttnlabError(f"world: plan handles at most {MAX_PLAN_WORLD} ranks (its cost grows "
                           f"as world² × key blocks), got {world}")
    for name, v in (("L", L), ("S", S)):
        if v > MAX_PLAN_LEN:
            raise AttnlabError(f"{name}: plan handles sequences of at most {MAX_PLAN_LEN:,} = 2^32 "
                               f"positions, got {v:,}")
    if H % Hkv:
        raise AttnlabError(f"Hkv: query heads H = {H} must be a multiple of Hkv = {Hkv}")
    link_gbps, intra_gbps, tflops, latency_us = links(link_gbps, intra_gbps, inter_gbps, tflops,
                                                      latency_us, calibration)
    for name, v in (("link_gbps", link_gbps), ("intra_gbps", intra_gbps), ("tflops", tflops)):
        if isinstance(v, bool) or not (isinstance(v, (int, float)) and v > 0):
            raise AttnlabError(f"{name}: expected a positive number, got {v!r}")
    if isinstance(latency_us, bool) or not (isinstance(latency_us, (int, float))
                                            and 0 <= latency_us < float("inf")):
        raise AttnlabError(f"latency_us: expected a number >= 0, got {latency_us!r}")
    m = effective_mask(mask, is_causal)
    if m is not None:
        m.check(L, S)
    geom = Geometry(L, S, world, layout, m)
    est = estimate(geom, B=batch, H=H, Hkv=Hkv, D=D, Dv=Dv, dtype=dtype, link_gbps=link_gbps,
                   tflops=tflops, latency_us=latency_us,
                   per_head_mask=m is not None and m.heads > 1,
                   masked_tflops=getattr(calibration, "masked_tflops", None))
    if ulysses_size is not None:
        est["hybrid"] = hybrid_estimate(geom, B=batch, H=H, Hkv=Hkv, D=D, Dv=Dv, dtype=dtype,
                                        U=ulysses_size, intra_gbps=intra_gbps,
                                        inter_gbps=link_gbps, tflops=tflops,
                                        latency_us=latency_us,
                                        per_head_mask=m is not None and m.heads > 1,
                                        masked_tflops=getattr(calibration, "masked_tflops",
                                                              None))
    ch = choose(est)
    return Plan(L, S, world, layout, "full" if m is None else repr(m), est, ch.strategy,
                ch.reason)


def links(link_gbps, intra_gbps, inter_gbps, tflops, latency_us, calibration=None):
    """(inter-group link, intra-group link, tflops, latency µs) from the arguments of `plan`:
    a calibration's measured numbers when given, else inter_gbps (default link_gbps) between
    groups and intra_gbps (default the inter link) inside them."""
    if calibration is not None:
        return (calibration.inter_gbps, calibration.intra_gbps, calibration.tflops,
                calibration.latency_us)
    inter = link_gbps if inter_gbps is None else inter_gbps
    return inter, inter if intra_gbps is None else intra_gbps, tflops, latency_us


def explain(L: int, H: int, Hkv: int, D: int, world: int, **kwargs) -> StrategyChoice:
    """Which strategy "auto" picks for these sizes, and why (as `attnlab.select_backend`)."""
    p = plan(L, H, Hkv, D, world, **kwargs)
    return StrategyChoice(p.choice, p.reason)
