"""The one timer of the benchmark scripts: several steps timed in turn within each repeat, so a
change in a busy machine's load falls on all of them alike, and the median of each."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_medians(steps: dict[str, Callable[[], object]], repeats: int, *,
                        warmup: int = 1, burst: int = 1,
                        clock: Callable[[], float] = time.perf_counter,
                        before: dict[str, Callable[[], object]] | None = None
                        ) -> dict[str, float]:
    """Median seconds per call of each step: `warmup` untimed calls of each first, then in each
    of `repeats` rounds every step runs `burst` calls in a row, timed together, the steps in
    turn; `before[name]`, where given, runs untimed right before that step's timing."""
    before = before or {}
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            if name in before:
                before[name]()
            t0 = clock()
            for _ in range(burst):
                fn()
            times[name].append((clock() - t0) / burst)
    return {name: statistics.median(t) for name, t in times.items()}
