"""A mask function against the built-in kind it equals (CPU): on "auto" and on the tiled loop.

    .venv/bin/python benchmarks/mask_function.py                    # sliding window 256 @ 16k
    .venv/bin/python benchmarks/mask_function.py --L 4096 --window 128 --repeats 3

masks.from_function(fn) evaluates fn on every pair once per shape (cached); that one pass gives
its exact tile classes and, per row, whether its keys form one interval. A function equal to a
sliding window is interval-shaped, so "auto" runs it on the compiled interval kernel as it runs
the built-in. The table gives the steady-state medians of both on backend "auto" (the interval
kernel) and on the tiled loop (ATTNLAB_KERNEL=0, backend="tiled"), the four timed in turn in each
repeat after one warm-up call each that also fills the caches, their ratios, and the one-off cost
of the evaluation.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import torch

import attnlab
from attnlab import masks
from attnlab.bench.timing import interleaved_medians


@dataclass(frozen=True)
class Config:
    L: int
    window: int
    B: int
    H: int
    D: int
    repeats: int
    threads: int



def with_kernel(flag: str, fn):
    """fn run with ATTNLAB_KERNEL=flag ("0": the tiled loop for every mask)."""
    def run():
        before = os.environ.get("ATTNLAB_KERNEL")
        os.environ["ATTNLAB_KERNEL"] = flag
        try:
            fn()
        finally:
            if before is None:
                os.environ.pop("ATTNLAB_KERNEL")
            else:
                os.environ["ATTNLAB_KERNEL"] = before
    return run


def run(cfg: Config) -> list[tuple]:
    torch.set_num_threads(cfg.threads)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(cfg.B, cfg.H, cfg.L, cfg.D, generator=g) for _ in range(3))
    w = cfg.window

    def sliding(b, h, qi, ki):
        return (qi >= ki) & (qi - ki < w)

    t0 = time.perf_counter()
    fn_mask = masks.from_function(sliding)
    assert fn_mask.intervals(cfg.L, cfg.L) is not None  # the one evaluation: the one-off cost
    classify = time.perf_counter() - t0
    builtin = masks.sliding_window(w)
    chosen = {name: attnlab.select_backend(q, k, v, mask=m).backend
              for name, m in (("builtin", builtin), ("function", fn_mask))}
    rows = []
    for mode in ("fwd", "fwd+bwd"):
        steps = {}
        for name, m, kernel, backend in (
                ("builtin auto", builtin, "1", "auto"), ("function auto", fn_mask, "1", "auto"),
                ("builtin tiled", builtin, "0", "tiled"),
                ("function tiled", fn_mask, "0", "tiled")):
            xs = [x.clone().requires_grad_(mode == "fwd+bwd") for x in (q, k, v)]

            def step(m=m, xs=xs, mode=mode, backend=backend):
                out = attnlab.attention(*xs, mask=m, backend=backend)
                if mode == "fwd+bwd":
                    out.sum().backward()

            steps[name] = with_kernel(kernel, step)
        t = interleaved_medians(steps, cfg.repeats)
        rows.append((mode, t["builtin auto"], t["function auto"], t["builtin tiled"],
                     t["function tiled"]))
    return rows, classify, chosen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--L", type=int, default=16384)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    cfg = Config(a.L, a.window, a.B, a.H, a.D, a.repeats, a.threads)
    rows, classify, chosen = run(cfg)
    print(f"# sliding window {cfg.window} @ L={cfg.L}, B={cfg.B} H={cfg.H} D={cfg.D} fp32, "
          f"{cfg.threads} thread(s), median of {cfg.repeats}; auto runs the built-in on "
          f"{chosen['builtin']!r}, the function on {chosen['function']!r}\n")
    print("| mode | sliding_window, auto (s) | from_function, auto (s) | function / built-in | "
          "sliding_window, tiled loop (s) | from_function, tiled loop (s) | function / built-in |")
    print("|---|---|---|---|---|---|---|")
    for mode, a_, b_, c_, d_ in rows:
        print(f"| {mode} | {a_:.3f} | {b_:.3f} | {b_ / a_:.2f} | {c_:.3f} | {d_:.3f} | "
              f"{d_ / c_:.2f} |")
    print(f"\none-off evaluation of the function ({cfg.L}x{cfg.L} pairs: tile classes and "
          f"intervals, cached per shape): {classify:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
