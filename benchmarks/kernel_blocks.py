"""The interval kernel's block sizes (csrc/interval.h: BQ, BK, KP) against alternatives, in one run.

    .venv/bin/python benchmarks/kernel_blocks.py                 # window 256 @ 16k, causal 4k
    .venv/bin/python benchmarks/kernel_blocks.py --repeats 9 --isa avx2

Each variant is the kernel built with one size changed (-DATTNLAB_BQ=32 ...) into a temporary
folder under its own op namespace, then swapped in as the build `attnlab.attention` runs; the
variants are timed in turn call by call (one thread, fp32, B = 1, H = 8, D = 64, median of the
repeats after a warm-up), forward and forward + backward, and shown as time / the shipped sizes'
time (above 1: slower). Caution: on a shared machine say what load was present.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import attnlab
from attnlab import masks
from attnlab.ops.kernels import build
from attnlab.ops.kernels.toolchain import ninja_on_path

VARIANTS = {"shipped": {}, "BQ=32": {"BQ": 32}, "BQ=128": {"BQ": 128}, "BK=256": {"BK": 256},
            "KP=32": {"KP": 32}, "KP=128": {"KP": 128}}


def compile_variant(isa: str, name: str, sizes: dict, folder: Path):
    """torch.ops namespace of the kernel built with `sizes` overridden."""
    from torch.utils import cpp_extension

    ns = f"attnlab_blocks_{isa}_{name.replace('=', '_').lower()}"
    defs = [f"-DATTNLAB_{k}={v}" for k, v in sizes.items()]
    with ninja_on_path():
        cpp_extension.load(name=ns, sources=[str(build.CSRC / s) for s in build.SOURCES],
                           extra_cflags=[*build.COMMON_FLAGS, *build.ISA_FLAGS[isa],
                                         f"-DATTNLAB_NS={ns}", *defs],
                           extra_include_paths=[str(build.CSRC)], build_directory=str(folder),
                           is_python_module=False, verbose=False)
    return getattr(torch.ops, ns)


def cases(L_window: int, L_causal: int):
    return [(f"window 256 @ {L_window // 1024}k", L_window, masks.sliding_window(256)),
            (f"causal {L_causal // 1024}k", L_causal, masks.causal())]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--isa", default=None)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--L-window", type=int, default=16384)
    ap.add_argument("--L-causal", type=int, default=4096)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    isa = args.isa or build.chosen_isa()
    build.load(isa)
    ops = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.variants:
            if VARIANTS[name]:
                folder = Path(tmp) / name.replace("=", "_")
                folder.mkdir()
                ops[name] = compile_variant(isa, name, VARIANTS[name], folder)
            else:
                ops[name] = build.load(isa)
    rows = ["| case | mode | shipped ms | " + " | ".join(n for n in ops if n != "shipped")
            + " |", "|---" * (len(ops) + 2) + "|"]
    g = torch.Generator().manual_seed(0)
    for label, L, m in cases(args.L_window, args.L_causal):
        for mode in ("fwd", "fwd+bwd"):
            q, k, v = (torch.randn(1, 8, L, 64, generator=g).requires_grad_(mode != "fwd")
                       for _ in range(3))
            times: dict[str, list[float]] = {n: [] for n in ops}
            for rep in range(args.repeats + 1):
                for name, o in ops.items():
                    build._LOADED[isa] = o  # the build attention runs
                    t0 = time.perf_counter()
                    out = attnlab.attention(q, k, v, mask=m, backend="interval")
                    if mode != "fwd":
                        out.sum().backward()
                    if rep:
                        times[name].append(time.perf_counter() - t0)
            med = {n: statistics.median(t) for n, t in times.items()}
            rows.append(f"| {label} | {mode} | {med['shipped'] * 1e3:.1f} | " + " | ".join(
                f"{med[n] / med['shipped']:.2f}" for n in ops if n != "shipped") + " |")
    build._LOADED[isa] = ops["shipped"]
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"# {isa}, one thread, median of {args.repeats}; load average {load} at the end")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
