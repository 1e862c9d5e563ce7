"""Small calls: a call's fixed cost against PyTorch's fused kernel (CPU, fp32).

    .venv/bin/python benchmarks/small_calls.py                 # L = 16, 64, 128, 256; 1, 2 threads
    .venv/bin/python benchmarks/small_calls.py --L 32 1024 --threads 1 --repeats 100

At small L the arithmetic takes microseconds and what a call costs besides it decides: attnlab's
checks, its choice of backend, the autograd Function, the NaN/Inf checks, the kernel's glue. The
table gives the time of one causal call (B = 1, H = 8, D = 64) through `attnlab.attention`
(is_causal=True, backend "auto") and through `torch.nn.functional.scaled_dot_product_attention`
(is_causal=True), forward and forward + backward: the median over repeats of bursts of BURST
calls in a row, the four timed in turn in each repeat; and their ratio (× = SDPA time / attnlab
time: above 1, attnlab is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import attnlab

BURST = 10  # calls of one step in a row: the same layer called again, caches warm


def interleaved(steps: dict, repeats: int) -> dict:
    """Median seconds per call of each step: in each repeat every step runs BURST calls in a
    row, timed together, the steps in turn (a busy machine's load falls on all alike); a few
    untimed warm-up calls each first."""
    for fn in steps.values():
        for _ in range(5):
            fn()
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            for _ in range(BURST):
                fn()
            times[name].append((time.perf_counter() - t0) / BURST)
    return {name: statistics.median(t) for name, t in times.items()}


def steps(L: int, H: int, D: int) -> dict:
    q, k, v = (torch.randn(1, H, L, D) for _ in range(3))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

    def fb(fn):
        def run():
            fn(qg, kg, vg, is_causal=True).sum().backward()
            for x in (qg, kg, vg):
                x.grad = None
        return run

    return {
        "attnlab fwd": lambda: attnlab.attention(q, k, v, is_causal=True),
        "sdpa fwd": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "attnlab fwd+bwd": fb(attnlab.attention),
        "sdpa fwd+bwd": fb(F.scaled_dot_product_attention),
    }


def table(lengths, threads, H: int, D: int, repeats: int) -> list[str]:
    rows = ["| threads | L | fwd attnlab µs | fwd SDPA µs | × | fwd+bwd attnlab µs | "
            "fwd+bwd SDPA µs | × |", "|---|---|---|---|---|---|---|---|"]
    n = torch.get_num_threads()
    try:
        for t in threads:
            torch.set_num_threads(t)
            for L in lengths:
                m = interleaved(steps(L, H, D), repeats)
                a, s = m["attnlab fwd"] * 1e6, m["sdpa fwd"] * 1e6
                ab, sb = m["attnlab fwd+bwd"] * 1e6, m["sdpa fwd+bwd"] * 1e6
                rows.append(f"| {t} | {L} | {a:.0f} | {s:.0f} | {s / a:.2f} | {ab:.0f} | "
                            f"{sb:.0f} | {sb / ab:.2f} |")
    finally:
        torch.set_num_threads(n)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--L", type=int, nargs="+", default=[16, 64, 128, 256])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args(argv)
    if min(a.L + a.threads + [a.heads, a.dim, a.repeats]) < 1:
        ap.error("--L, --threads, --heads, --dim and --repeats take positive numbers")
    print(f"# small causal calls: fp32, B = 1, H = {a.heads}, D = {a.dim}; median of "
          f"{a.repeats} bursts of {BURST} calls, wall clock; torch {torch.__version__}")
    print("\n".join(table(a.L, a.threads, a.heads, a.dim, a.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
