"""Small calls: a call's fixed cost against PyTorch's fused kernel (CPU, fp32).

    .venv/bin/python benchmarks/small_calls.py                 # L = 16, 64, 128, 256; 1, 2 threads
    .venv/bin/python benchmarks/small_calls.py --L 32 1024 --threads 1 --repeats 100
    .venv/bin/python benchmarks/small_calls.py --L 1 16 64 --masks causal none --clock cpu
    .venv/bin/python benchmarks/small_calls.py --L 1 16 64 --layouts hld ld proj gqa gqa-proj

At small L the arithmetic takes microseconds and what a call costs besides it decides: attnlab's
checks, its choice of backend, the autograd Function, the NaN/Inf checks, the kernel's glue. The
table gives the time of one causal call (B = 1, H = 8, D = 64) through `attnlab.attention`
(is_causal=True, backend "auto") and through `torch.nn.functional.scaled_dot_product_attention`
(is_causal=True), forward and forward + backward: the median over repeats of bursts of BURST
calls in a row, the four timed in turn in each repeat (each pair's two swapping places every
other repeat: `medians`); and their ratio (× = SDPA time / attnlab time: above 1, attnlab is
faster) and difference (+µs = attnlab - SDPA). `--masks none` adds calls without a mask.
`--clock cpu` times the calling thread's CPU time instead of the wall clock: on a machine
shared with other jobs the wall clock of a few-µs call is mostly other processes' time slices
(meaningful for one thread: a helper thread's time is not the caller's).
`--layouts` times the layouts models make besides (B, H, L, D) (`LAYOUTS`), one table each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import attnlab
from attnlab.bench.timing import interleaved_medians

BURST = 10  # calls of one step in a row: the same layer called again, caches warm


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}



#: the inputs' layouts: name -> (what it is, make(L, H, D, grad) -> (q, k, v, enable_gqa)); a
#: projection's (B, L, H, D) output viewed as (B, H, L, D) is made as one (B, L, 3·H·D) block
#: sliced, as a fused qkv Linear gives it; grouped-query calls have H / 4 key/value heads
LAYOUTS = {
    "bhld": ("(1, H, L, D) contiguous", lambda L, H, D, g: (*_plain((1, H, L, D), g), False)),
    "hld": ("(H, L, D), no batch dim", lambda L, H, D, g: (*_plain((H, L, D), g), False)),
    "ld": ("(L, D), no head dim", lambda L, H, D, g: (*_plain((L, D), g), False)),
    "proj": ("(1, L, H, D) views of one qkv projection, as (1, H, L, D)",
             lambda L, H, D, g: (*_projected(L, H, H, D, g), False)),
    "gqa": ("(1, H, L, D) against (1, H / 4, L, D), enable_gqa",
            lambda L, H, D, g: (*_plain((1, H, L, D), g, (1, max(H // 4, 1), L, D)), True)),
    "gqa-proj": ("grouped-query heads from one qkv projection's views, enable_gqa",
                 lambda L, H, D, g: (*_projected(L, H, max(H // 4, 1), D, g), True)),
}


def _plain(shape, grad: bool, kv_shape=None):
    kv_shape = kv_shape or shape
    q = torch.randn(shape)
    k, v = torch.randn(kv_shape), torch.randn(kv_shape)
    return tuple(x.requires_grad_(grad) for x in (q, k, v))


def _projected(L: int, H: int, Hkv: int, D: int, grad: bool):
    """q (1, H, L, D), k, v (1, Hkv, L, D): views of one (1, L, (H + 2·Hkv)·D) projection."""
    qkv = torch.randn(1, L, (H + 2 * Hkv) * D).requires_grad_(grad)  # a leaf: its grad is kept
    q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
    return (q.unflatten(-1, (H, D)).transpose(1, 2), k.unflatten(-1, (Hkv, D)).transpose(1, 2),
            v.unflatten(-1, (Hkv, D)).transpose(1, 2))


def steps(L: int, H: int, D: int, causal: bool = True, layout: str = "bhld") -> dict:
    make = LAYOUTS[layout][1]
    q, k, v, gqa = make(L, H, D, False)
    qg, kg, vg, _ = make(L, H, D, True)
    leaves = {x if x.is_leaf else x._base for x in (qg, kg, vg)}  # a view's grad goes to its base
    kw = {"is_causal": causal, "enable_gqa": True} if gqa else {"is_causal": causal}

    def fb(fn):
        def run():
            fn(qg, kg, vg, **kw).sum().backward()
            for x in leaves:
                x.grad = None
        return run

    return {
        "attnlab fwd": lambda: attnlab.attention(q, k, v, **kw),
        "sdpa fwd": lambda: F.scaled_dot_product_attention(q, k, v, **kw),
        "attnlab fwd+bwd": fb(attnlab.attention),
        "sdpa fwd+bwd": fb(F.scaled_dot_product_attention),
    }


def medians(steps: dict, repeats: int, clock) -> dict:
    """`interleaved_medians` of the steps, attnlab's and SDPA's of each pair swapping places
    every other repeat: a step right after a backward finds its inputs out of cache (its burst's
    first call costs up to tens of µs more at L = 64, SDPA's as attnlab's), so each step comes
    after the other pair's backward as often as its peer does (in one fixed order, SDPA against
    itself reads 0.93× at L = 1 and 64)."""
    for fn in steps.values():
        for _ in range(5):  # warm up
            fn()
    names = list(steps)  # (attnlab, SDPA) pairs
    swapped = [n for i in range(0, len(names), 2) for n in names[i:i + 2][::-1]]
    times: dict = {name: [] for name in names}
    for r in range(repeats):
        order = names if r % 2 == 0 else swapped
        got = interleaved_medians({n: steps[n] for n in order}, 1, warmup=0, burst=BURST,
                                  clock=clock)
        for name, t in got.items():
            times[name].append(t)
    return {name: statistics.median(t) for name, t in times.items()}


def table(lengths, threads, H: int, D: int, repeats: int, masks=("causal",),
          clock=time.perf_counter, layout: str = "bhld") -> list[str]:
    rows = ["| threads | mask | L | fwd attnlab µs | fwd SDPA µs | × | +µs | fwd+bwd attnlab µs "
            "| fwd+bwd SDPA µs | × | +µs |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    n = torch.get_num_threads()
    try:
        for t in threads:
            torch.set_num_threads(t)
            for mask in masks:
                for L in lengths:
                    m = medians(steps(L, H, D, mask == "causal", layout), repeats, clock)
                    a, s = m["attnlab fwd"] * 1e6, m["sdpa fwd"] * 1e6
                    ab, sb = m["attnlab fwd+bwd"] * 1e6, m["sdpa fwd+bwd"] * 1e6
                    rows.append(f"| {t} | {mask} | {L} | {a:.1f} | {s:.1f} | {s / a:.2f} | "
                                f"{a - s:+.1f} | {ab:.0f} | {sb:.0f} | {sb / ab:.2f} | "
                                f"{ab - sb:+.0f} |")
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
    ap.add_argument("--masks", nargs="+", choices=("causal", "none"), default=["causal"])
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    ap.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=["bhld"])
    a = ap.parse_args(argv)
    if min(a.L + a.threads + [a.heads, a.dim, a.repeats]) < 1:
        ap.error("--L, --threads, --heads, --dim and --repeats take positive numbers")
    print(f"# small calls: fp32, B = 1, H = {a.heads}, D = {a.dim}, S = L; median of "
          f"{a.repeats} bursts of {BURST} calls, {a.clock} clock; torch {torch.__version__}; "
          f"load {_load()} before")
    for layout in a.layouts:
        if a.layouts != ["bhld"]:
            print(f"# layout {layout}: {LAYOUTS[layout][0]}")
        print("\n".join(table(a.L, a.threads, a.heads, a.dim, a.repeats, a.masks,
                               CLOCKS[a.clock], layout)))
    print(f"# load {_load()} after")
    return 0


def _load() -> str:
    """The 1, 5 and 15 minute load averages (what shares the cores with these µs calls)."""
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
