"""The planning table of benchmarks/distributed.py: what planning costs, first and cached.

For each mask at L = 1,048,576 over P = 64 ranks (H = 32, Hkv = 8, D = 128, bf16, zigzag):

- `plan` s: `attnlab.distributed.plan(...)` on a fresh mask (every size, every strategy);
- first call ms: what `context_parallel_attention` spends planning on a new call signature — the
  mask's fingerprint (it keys the signature) and its two `api._cached` look-ups, which build the
  geometry and every strategy's estimate;
- next call ms: the same on a second call with the same signature and the same mask object
  (the fingerprint, its tensors' digests kept, and two cache hits).

The look-ups are the very ones `context_parallel_attention` makes (same keys, same builders), run
here for one rank of the 64 without the 64 processes (planning needs no communication); the row
"checked" confirms on a real call (one process) that a second call builds no geometry. Median of
`repeats`.

    .venv/bin/python benchmarks/distributed.py --planning

Caution: wall-clock on a shared machine; say what load was present.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

L, P, H, HKV, D = 1 << 20, 64, 32, 8, 128
MASKS = ("causal", "sliding:4096", "document:16")


def _mask(spec: str):
    """A fresh (mask, is_causal) as `attnlab plan-cp --mask` reads it."""
    from attnlab.cli.plan_cp import parse_mask

    return parse_mask(spec, L)


def _planning_s(m, is_causal: bool) -> float:
    """Seconds `context_parallel_attention`'s planning part takes: fingerprint, then the
    geometry and the estimates through `api._cached`, with the call's own keys."""
    from attnlab.distributed import api, cost, validate
    from attnlab.distributed.geometry import Geometry

    eff = cost.effective_mask(m, is_causal)
    t0 = time.perf_counter()
    sig = (L, L, P, "zigzag", validate.fingerprint(m), is_causal)
    geom = api._cached(sig, lambda: Geometry(L, L, P, "zigzag", eff))
    api._cached((*sig, 1, H, HKV, D, D, str(torch.bfloat16), None, None, False),
                lambda: api._estimates(geom, 1, H, HKV, D, D, torch.bfloat16, eff, None, None,
                                       0.0))
    return time.perf_counter() - t0


def _checked() -> bool:
    """A second real call with the same signature builds no geometry (one process)."""
    import attnlab.distributed as cp
    from attnlab.distributed import api

    made, real = [], api.Geometry
    api.Geometry = lambda *a, **k: made.append(a) or real(*a, **k)
    try:
        q, k, v = (torch.randn(1, 2, 256, 16) for _ in range(3))
        for _ in range(2):
            cp.context_parallel_attention(q, k, v, is_causal=True)
    finally:
        api.Geometry = real
    return len(made) == 1


def planning_table(repeats: int = 3) -> None:
    import attnlab.distributed as cp
    from attnlab.distributed import api

    cp.plan(4096, 8, 8, 64, 4, is_causal=True)  # warm-up: imports, torch's first calls
    print(f"\n## planning: L={L:,}, P={P}, H={H}, Hkv={HKV}, D={D}, bf16, zigzag; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start; "
          f"median of {repeats}\n")
    print("| mask | `plan` s | first call: planning ms | next call: planning ms |")
    print("|---|---|---|---|")
    for spec in MASKS:
        plans, firsts, nexts = [], [], []
        for _ in range(repeats):
            m, is_causal = _mask(spec)
            t0 = time.perf_counter()
            cp.plan(L, H, HKV, D, P, mask=m, is_causal=is_causal)
            plans.append(time.perf_counter() - t0)
            api._PLANS.clear()
            m, is_causal = _mask(spec)  # the mask a training loop builds once and passes again
            firsts.append(_planning_s(m, is_causal))
            nexts.append(_planning_s(m, is_causal))
        print(f"| {spec} | {statistics.median(plans):.3f} | "
              f"{statistics.median(firsts) * 1e3:,.0f} | {statistics.median(nexts) * 1e3:.3f} |")
    print(f"\nchecked: a second real call with the same signature builds no geometry: "
          f"{_checked()}")
