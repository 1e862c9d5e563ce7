"""Context-parallel attention on P processes of this machine (gloo over loopback, one thread per
rank) against single-process attnlab at the same L: forward + backward time, bytes moved, share
of time waiting on communication, and peak memory per rank.

    .venv/bin/python benchmarks/distributed.py                     # L=4096, P = 1 2, ~2 minutes
    .venv/bin/python benchmarks/distributed.py --L 8192 --world 1 2 4 --mask sliding:512
    .venv/bin/python benchmarks/distributed.py --L 16384 --mask sliding:512 document:8 causal \
        --strategies ring                                  # the window / document / causal tables
    .venv/bin/python benchmarks/distributed.py --auto --L 8192 --world 2   # does auto pick well?
    .venv/bin/python benchmarks/distributed.py --memory --L 32768 --heads 4 --world 2
    .venv/bin/python benchmarks/distributed.py --planning   # plan at 1M / 64 ranks, cached calls
    .venv/bin/python benchmarks/distributed.py --paired --strategies ring   # taking turns

Each (P, strategy) runs in fresh processes, so the peak resident memory each rank adds while it
runs one forward + backward (ru_maxrss after the inputs exist, minus before) is comparable with
the single-process row. "wait %" is the time ranks spent blocked in communication calls (for the
ring: what compute did not hide). "plan MiB" is `attnlab.distributed.plan`'s prediction for the
same call; "sent MiB" and "msgs" what the counting wrapper logged (forward + backward, the
busiest rank).

Caution: P ranks share this machine's cores; with P above the core count they time-slice, and
the time column says nothing about a real cluster (`attnlab plan-cp` does that on paper).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from attnlab.distributed import spawn


@dataclass(frozen=True)
class Config:
    L: int
    H: int
    Hkv: int
    D: int
    dtype: str
    mask: str
    layout: str
    repeats: int


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed(step, repeats: int):
    base = _rss_mib()
    t0 = time.perf_counter()
    step()  # the first run also sets the peak
    first = time.perf_counter() - t0
    peak = _rss_mib() - base
    times = [first]
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:] or times), peak


def _rank_main(rank, world, cfg: Config, strategy: str) -> dict:
    """One rank's measurements (run by `attnlab.distributed.spawn` in a fresh process)."""
    from attnlab.cli.plan_cp import parse_mask
    from distributed_inputs import inputs

    mask, is_causal = parse_mask(cfg.mask, cfg.L)
    if strategy == "single":
        import attnlab

        q, k, v = (x.requires_grad_() for x in inputs(cfg))

        def step():
            out = attnlab.attention(q, k, v, mask=mask, is_causal=is_causal,
                                    enable_gqa=cfg.Hkv != cfg.H)
            out.sum().backward()

        ms, peak = _timed(step, cfg.repeats)
        return {"s": ms, "peak": peak, "sent": 0, "plan": 0, "wait": 0.0, "msgs": 0}
    import attnlab.distributed as cp

    # the whole tensors are dropped once sharded
    ql, kl, vl = [cp.shard(x, cfg.layout).requires_grad_() for x in inputs(cfg)]
    logs = []

    def step():
        with cp.record() as log:
            out = cp.context_parallel_attention(
                ql, kl, vl, layout=cfg.layout, strategy=strategy, mask=mask,
                is_causal=is_causal, enable_gqa=cfg.Hkv != cfg.H)
            out.sum().backward()
        logs.append(log)

    s, peak = _timed(step, cfg.repeats)
    log = logs[-1]
    est = cp.plan(cfg.L, cfg.H, cfg.Hkv, cfg.D, world, mask=mask, is_causal=is_causal,
                  layout=cfg.layout, dtype=ql.dtype)[strategy]
    sent = log.total("forward") + log.total("backward")
    wait = log.seconds("forward") + log.seconds("backward")
    msgs = log.messages("forward") + log.messages("backward")
    return {"s": s, "peak": peak, "sent": sent, "wait": wait / max(s, 1e-9), "msgs": msgs,
            "plan": est.fwd_sent[rank] + est.bwd_sent[rank]}


def run(cfg: Config, world: int, strategy: str, timeout_s: float = 1800) -> list[dict]:
    """Every rank's measurements of one (P, strategy), in fresh processes."""
    return spawn(_rank_main, world, cfg, strategy, timeout_s=timeout_s, group_timeout_s=600)


def table(cfg: Config, worlds, strategies) -> None:
    """One table: single-process attnlab, then every (P, strategy), each in fresh processes."""
    print(f"# context-parallel attention, fwd+bwd: L={cfg.L}, B=1, H={cfg.H}, Hkv={cfg.Hkv}, "
          f"D={cfg.D}, {cfg.dtype}, mask {cfg.mask}, layout {cfg.layout}; torch "
          f"{torch.__version__}, {os.cpu_count()} CPUs, 1 thread per rank, gloo on loopback; "
          f"median of {cfg.repeats}; load average {os.getloadavg()[0]:.1f} at the start\n")
    (single,) = run(cfg, 1, "single")
    print("| P | strategy | ms | × single | sent MiB/rank | plan MiB/rank | msgs/rank | wait % | "
          "peak MiB/rank | peak / single |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| 1 | attnlab.attention | {single['s'] * 1e3:,.0f} | 1.00 | 0 | 0 | 0 | 0 | "
          f"{single['peak']:,.0f} | 1.00 |")
    mib = 2**20
    for P in worlds:
        for strategy in strategies:
            try:
                rows = run(cfg, P, strategy)
            except Exception as e:
                print(f"| {P} | {strategy} | — | — | — | — | — | — | — | "
                      f"{type(e).__name__}: {str(e).splitlines()[0]} |")
                continue
            s = max(r["s"] for r in rows)
            peak = max(r["peak"] for r in rows)
            print(f"| {P} | {strategy} | {s * 1e3:,.0f} | {single['s'] / s:.2f} | "
                  f"{max(r['sent'] for r in rows) / mib:,.2f} | "
                  f"{max(r['plan'] for r in rows) / mib:,.2f} | "
                  f"{max(r['msgs'] for r in rows)} | "
                  f"{100 * max(r['wait'] for r in rows):.0f} | {peak:,.0f} | "
                  f"{peak / max(single['peak'], 1e-9):.2f} |", flush=True)
    print()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--L", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp64"])
    ap.add_argument("--mask", nargs="+", default=["causal"],
                    help="as `attnlab plan-cp --mask`; several: one table each")
    ap.add_argument("--layout", default="zigzag")
    ap.add_argument("--world", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--strategies", nargs="+", default=["ring", "allgather", "ulysses"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory", action="store_true", help="the memory table instead: what a "
                    "causal fwd+bwd adds per rank, one process vs each strategy at each P "
                    "(benchmarks/distributed_memory.py)")
    ap.add_argument("--auto", action="store_true", help="the auto table instead: each strategy "
                    "measured and auto's pick on a calibration (benchmarks/distributed_auto.py)")
    ap.add_argument("--planning", action="store_true", help="the planning table instead: "
                    "plan at L = 1M, P = 64 and what a call spends planning, first and cached "
                    "(benchmarks/distributed_planning.py; median of at least 5)")
    ap.add_argument("--paired", action="store_true", help="the paired table instead: one "
                    "process and each strategy take turns in one group, the ratio per pair "
                    "(benchmarks/distributed_paired.py)")
    a = ap.parse_args(argv)
    if a.planning:
        from distributed_planning import planning_table

        planning_table(max(a.repeats, 5))
        return 0
    if a.memory:
        from distributed_memory import memory_table

        for P in a.world:
            if P > 1:
                memory_table(a.L, a.heads, a.head_dim, P)
        return 0
    if a.auto:
        from distributed_auto import auto_table

        for P in a.world:
            auto_table(a.L, a.heads, a.head_dim, P, a.repeats)
        return 0
    for mask in a.mask:
        cfg = Config(a.L, a.heads, a.kv_heads or a.heads, a.head_dim, a.dtype, mask, a.layout,
                     a.repeats)
        if a.paired:
            from distributed_paired import paired_table

            paired_table(cfg, a.world, a.strategies)
        else:
            table(cfg, a.world, a.strategies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
