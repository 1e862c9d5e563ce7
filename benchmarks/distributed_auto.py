"""The `auto` table of benchmarks/distributed.py: does "auto" pick the fastest strategy?

On one spawned group of P processes (gloo over loopback, one thread per rank): calibrate the
group (`attnlab.distributed.calibrate`), then for each mask time every strategy's forward +
backward (median of `repeats` after a warm-up, the strategies taking turns; the busiest rank)
and set beside it the time
`plan` predicts on the calibration, and the picks of "auto" — on the calibration and on the
defaults (100 Gbit/s, 100 TFLOP/s). "auto / fastest" is the measured time of the calibrated pick
over the fastest measured strategy (the target: within 1.10).

    .venv/bin/python benchmarks/distributed.py --auto --L 8192 --world 2

Caution: the ranks share this machine's cores with whatever else runs; say what load was present.
"""

from __future__ import annotations

import statistics
import time

import torch

STRATEGIES = ("ring", "allgather", "ulysses")
MASKS = ("causal", "sliding:512", "document:4")


def _rank(rank, world, L, H, D, repeats, masks) -> dict:
    import attnlab.distributed as cp
    from attnlab.cli.plan_cp import parse_mask

    cal = cp.calibrate()
    g = torch.Generator().manual_seed(0)
    q, k, v = (cp.shard(torch.randn(1, H, L, D, generator=g)).requires_grad_() for _ in range(3))
    out = {"cal": cal, "rows": {}}
    for spec in masks:
        mask, is_causal = parse_mask(spec, L)
        ts = {s: [] for s in STRATEGIES}
        for i in range(repeats + 1):  # strategies take turns: a burst of load hits them alike
            for s in STRATEGIES:
                t0 = time.perf_counter()
                y = cp.context_parallel_attention(q, k, v, strategy=s, mask=mask,
                                                  is_causal=is_causal)
                y.sum().backward()
                if i:
                    ts[s].append(time.perf_counter() - t0)
        row = {s: statistics.median(t) for s, t in ts.items()}
        kw = dict(mask=mask, is_causal=is_causal, dtype=torch.float32)
        p_cal = cp.plan(L, H, H, D, world, calibration=cal, **kw)
        p_def = cp.plan(L, H, H, D, world, **kw)
        row["predicted"] = {s: p_cal[s].time_s for s in STRATEGIES}
        row["auto"], row["auto_default"] = p_cal.choice, p_def.choice
        out["rows"][spec] = row
    return out


def auto_table(L: int, H: int, D: int, world: int, repeats: int, masks=MASKS) -> None:
    from attnlab.distributed import spawn

    per_rank = spawn(_rank, world, L, H, D, repeats, masks, timeout_s=3600,
                     group_timeout_s=900)
    cal = per_rank[0]["cal"]
    print(f"\n## auto: L={L}, B=1, H={H}, D={D}, fp32, zigzag, P={world}; calibrated: "
          f"{cal.describe()}\n")
    print("| mask | " + " | ".join(f"{s} ms (predicted)" for s in STRATEGIES)
          + " | fastest | auto (calibrated) | auto / fastest | auto (defaults) |")
    print("|---|" + "---|" * (len(STRATEGIES) + 4))
    for spec in masks:
        rows = [r["rows"][spec] for r in per_rank]
        ms = {s: max(r[s] for r in rows) for s in STRATEGIES}  # the busiest rank
        best = min(ms, key=ms.get)
        pred, pick = rows[0]["predicted"], rows[0]["auto"]
        cells = " | ".join(f"{ms[s] * 1e3:,.0f} ({pred[s] * 1e3:,.0f})" for s in STRATEGIES)
        print(f"| {spec} | {cells} | {best} | {pick} | {ms[pick] / ms[best]:.2f} | "
              f"{rows[0]['auto_default']} |")
