"""The paired table of benchmarks/distributed.py: one process and a strategy, taking turns.

The main table runs one process and each (P, strategy) in fresh processes one after another, so
a drift of the machine between them (on a shared VM, ±15% within a minute) lands in the ratio.
Here one spawned group of P processes (gloo over loopback, one thread per rank) alternates:
rank 0 runs one process's call on the whole tensors while the other ranks wait at a barrier,
then every rank runs the context-parallel call on its shard; each such pair gives one ratio
(one process's time over the busiest rank's), and the table shows the median of the ratios and
their spread.

    .venv/bin/python benchmarks/distributed.py --paired --L 4096 --world 1 2 --repeats 9
    .venv/bin/python benchmarks/distributed.py --paired --L 16384 --mask sliding:512

Caution: the ranks share this machine's cores with whatever else runs; say what load was present.
"""

from __future__ import annotations

import os
import statistics
import time


def _rank(rank, world, cfg, strategy: str) -> list[tuple[float, float]]:
    """[(one process s, this rank's strategy s)] of every pair after a warm-up (rank 0 times
    the one process; the others report 0 for it)."""
    import torch.distributed as dist

    import attnlab
    import attnlab.distributed as cp
    from attnlab.cli.plan_cp import parse_mask
    from distributed_inputs import inputs

    mask, is_causal = parse_mask(cfg.mask, cfg.L)
    gqa = cfg.Hkv != cfg.H
    whole = [x.requires_grad_() for x in inputs(cfg)] if rank == 0 else None
    part = [cp.shard(x, cfg.layout).requires_grad_() for x in inputs(cfg)]

    def one():
        out = attnlab.attention(*whole, mask=mask, is_causal=is_causal, enable_gqa=gqa)
        out.sum().backward()

    def split():
        out = cp.context_parallel_attention(*part, layout=cfg.layout, strategy=strategy,
                                            mask=mask, is_causal=is_causal, enable_gqa=gqa)
        out.sum().backward()

    pairs = []
    for i in range(cfg.repeats + 1):
        dist.barrier()
        t_one = 0.0
        if rank == 0:
            t0 = time.perf_counter()
            one()
            t_one = time.perf_counter() - t0
        dist.barrier()
        t0 = time.perf_counter()
        split()
        t_split = time.perf_counter() - t0
        if i:
            pairs.append((t_one, t_split))
    return pairs


def paired_table(cfg, worlds, strategies) -> None:
    from attnlab.distributed import spawn

    print(f"## paired: L={cfg.L}, B=1, H={cfg.H}, Hkv={cfg.Hkv}, D={cfg.D}, {cfg.dtype}, mask "
          f"{cfg.mask}, layout {cfg.layout}; 1 thread per rank, gloo on loopback; one process and "
          f"the strategy take turns, {cfg.repeats} pairs after a warm-up; load average "
          f"{os.getloadavg()[0]:.1f} at the start\n")
    print("| P | strategy | one process ms | strategy ms (busiest rank) | × one process, median "
          "of pairs | lowest – highest |")
    print("|---|---|---|---|---|---|")
    for P in worlds:
        for strategy in strategies:
            ranks = spawn(_rank, P, cfg, strategy, timeout_s=1800, group_timeout_s=600)
            one = [p[0] for p in ranks[0]]
            split = [max(r[i][1] for r in ranks) for i in range(len(one))]
            ratios = [a / b for a, b in zip(one, split)]
            print(f"| {P} | {strategy} | {statistics.median(one) * 1e3:,.0f} | "
                  f"{statistics.median(split) * 1e3:,.0f} | {statistics.median(ratios):.2f} | "
                  f"{min(ratios):.2f} – {max(ratios):.2f} |", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end\n")
