"""`attnlab bench`: attnlab's attention against PyTorch SDPA, a naive implementation and
FlexAttention, side by side, in one run (a markdown table on stdout).

Each row: milliseconds (median of repeats after a warm-up), useful GFLOP/s (only unmasked pairs
counted), peak extra memory, and the time ratio impl / attnlab (> 1: attnlab is faster). A peer
whose predicted time (scaled from its run at a shorter length) exceeds the budget is skipped and
says so, as is the naive implementation where its L×S matrices would not fit in memory.
"""

from __future__ import annotations

import math
import os
import sys
import time

from attnlab.cli.options import add_threads, command

QUICK = {"L": [1024], "masks": ["full", "causal", "sliding256", "document8"], "dtypes": ["fp32"],
         "modes": ["fwd", "fwd+bwd"], "peers": ["sdpa", "naive"], "repeats": 3}


def add_parser(sub):
    from attnlab.bench.case import DTYPES, MASKS, MODES, PEERS

    p = command(sub, "bench", __doc__, "benchmark attention against PyTorch SDPA and FlexAttention")
    p.add_argument("--quick", action="store_true",
                   help="a short run: L=1024, fp32, every mask and mode, sdpa and naive peers, 3 "
                   "repeats (sets --L, --masks, --dtypes, --modes, --peers, --repeats: not "
                   "with them)")
    p.add_argument("--L", type=int, nargs="+", default=None,
                   help="sequence lengths (default: 1024 4096 16384 65536)")
    p.add_argument("--masks", nargs="+", choices=MASKS, default=None,
                   help=f"masks to time (default: {' '.join(MASKS)})")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=None,
                   help="dtypes (default: fp32 bf16)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=None,
                   help=f"forward only, or forward and backward (default: {' '.join(MODES)})")
    p.add_argument("--peers", nargs="+", choices=[*PEERS, "none"], default=None,
                   help=f"what to compare with (default: {' '.join(PEERS)})")
    p.add_argument("--tiled", action="store_true", help="also time backend='tiled' forced")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed runs per cell, the median reported (default: 3)")
    p.add_argument("--budget", type=float, default=60.0,
                   help="skip a cell predicted to take longer than this many seconds")
    add_threads(p)
    return p


def _defaults(args) -> None:
    """--quick's settings, refusing the flags it would override; else the plain defaults."""
    from attnlab.bench.case import MASKS, MODES, PEERS
    from attnlab.errors import AttnlabError

    full = {"L": [1024, 4096, 16384, 65536], "masks": list(MASKS), "dtypes": ["fp32", "bf16"],
            "modes": list(MODES), "peers": list(PEERS), "repeats": 3}
    given = [k for k in full if getattr(args, k) is not None]
    if args.quick and given:
        flags = ", ".join(f"--{k}" for k in given)
        raise AttnlabError(f"--quick sets {flags} itself; leave out {flags} or --quick")
    for k, value in (QUICK if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, value)


def run(args) -> int:
    import torch

    from attnlab.bench import engine as br
    from attnlab.errors import AttnlabError

    _defaults(args)
    if args.repeats < 1 or any(n < 1 for n in args.L):
        raise AttnlabError("bench: --repeats and --L must be positive")
    if not (args.budget > 0 and math.isfinite(args.budget)):  # nan would bound nothing
        raise AttnlabError(f"--budget: expected a positive finite number of seconds, got "
                           f"{args.budget}")
    peers = [x for x in args.peers if x != "none"]
    impls = ["attnlab", *(["tiled"] if args.tiled else []), *peers]
    mem_kib = _mem_available_kib()
    print(f"# attnlab bench: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs; B=1, H=8, D=64; median of {args.repeats}\n")
    print("| L | mask | dtype | mode | impl | ms | GFLOP/s | peak extra MiB | × attnlab | note |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    prev: dict = {}
    start = time.perf_counter()
    for dtype in args.dtypes:
        for mode in args.modes:
            for mask in args.masks:
                for L in sorted(args.L):
                    case = br.Case(L=L, mask=mask, dtype=dtype, mode=mode)
                    q, k, v = br.make_inputs(case)
                    cells = [_cell(br, i, case, q, k, v, args, prev, mem_kib) for i in impls]
                    timed = br.measure([c for c in cells if isinstance(c, tuple)], case)
                    base = timed["attnlab"].ms if "attnlab" in timed else None
                    for c in cells:
                        r = timed[c[0]] if isinstance(c, tuple) else c
                        if r.ms is not None:
                            prev[(r.impl, mask, dtype, mode)] = (L, r.ms)
                        _row(case, r, base)
                        if r.impl == "attnlab" and mode == "fwd" and r.ms is not None:
                            _row(case, br.measure_weights(case, q, k, v), base)
                    del q, k, v, cells
    print(f"\ntotal {time.perf_counter() - start:.0f} s; inputs/out bytes per case: "
          "4·B·H·L·D·itemsize; FLOPs: 4·B·H·D per unmasked pair, ×3.5 for fwd+bwd")
    return 0


def _cell(br, impl, case, q, k, v, args, prev, mem_kib):
    """A Result saying why the cell is skipped, or (impl, fn, note, repeats, warmup) to time."""
    key = (impl, case.mask, case.dtype, case.mode)
    if impl == "naive" and mem_kib is not None:
        need = 3 * case.B * case.H * case.L * case.L * 4 // 1024
        if need > mem_kib // 2:
            return br.Result(impl, note=f"skipped (needs ~{need / 2**20:.0f} GiB for L×S)")
    runs, warm = args.repeats + 1, 1
    if key in prev:
        L0, ms0 = prev[key]
        linear = case.mask == "sliding256" and impl in ("attnlab", "tiled", "flex")
        guess = ms0 * 1e-3 * (case.L / L0) ** (1 if linear else 2)
        if guess * runs > args.budget:
            runs, warm = 1, 0
        if guess > args.budget:
            return br.Result(impl, note=f"skipped (would take ~{guess:.0f} s)")
    fn, note = br.runner(impl, case, q, k, v)
    if fn is None:
        return br.Result(impl, note=note)
    return impl, fn, note, max(1, runs - warm), warm


def _row(case, r, base):
    def f(x, spec):
        return "" if x is None else format(x, spec)
    ratio = "" if r.ms is None or not base else f"{r.ms / base:.2f}"
    print(f"| {case.L} | {case.mask} | {case.dtype} | {case.mode} | {r.impl} | {f(r.ms, '.1f')} | "
          f"{f(r.gflops, '.1f')} | {f(r.peak_mib, '.0f')} | {ratio} | {r.note} |")
    sys.stdout.flush()


def _mem_available_kib():
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None
