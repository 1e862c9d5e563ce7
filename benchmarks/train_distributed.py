"""Train the `tiny` GPT preset in one process, with `--nproc 2 --dp 2` and with `--nproc 2 --cp 2`
on this machine (one thread per process), and print tokens/s (all processes together), the loss
after a fixed number of steps, and the peak memory per process, side by side.

Each run is one `attnlab train` as a user starts it (a fresh process; the launcher starts the
workers), so start-up is not in tokens/s: the trainer times its steps. The losses of the three
rows agree to 1e-4 by construction (the same global batch and data order; tested). With
`--repeat N` the layouts take turns N times (so a burst of load from other jobs hits them alike)
and each row shows the median run and the range of tokens/s.

    python benchmarks/train_distributed.py                       # 100 steps, batch 24
    python benchmarks/train_distributed.py --repeat 3            # interleaved, median and range
    python benchmarks/train_distributed.py --steps 300 --batch-size 48 --preset tiny-gqa

On several machines the same run is one torchrun per machine (same --rdzv-endpoint):
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m attnlab train --preset small --dp 8 --cp 2 --out /shared/runs/small
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

LAYOUTS = {"1 process": [], "--dp 2": ["--nproc", "2", "--dp", "2"],
           "--cp 2": ["--nproc", "2", "--cp", "2"]}
SUMMARY = re.compile(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+), ([\d,]+) tokens/s, "
                     r"([\d.]+) s training, peak memory ([\d,]+) MiB/process")


@dataclass(frozen=True)
class Bench:
    steps: int = 100
    batch_size: int = 24
    preset: str = "tiny"


def run(b: Bench, name: str, extra: list[str], root: Path) -> dict:
    out = root / name.replace(" ", "-").strip("-")
    cmd = [sys.executable, "-m", "attnlab", "train", "--preset", b.preset, "--max-steps",
           str(b.steps), "--batch-size", str(b.batch_size), "--eval-interval", str(b.steps),
           "--threads", "1", "--out", str(out), "--quiet", *extra]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    m = SUMMARY.search(p.stdout)
    if p.returncode != 0 or m is None:
        raise SystemExit(f"{name}: {' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    history = json.loads((out / "attnlab.json").read_text())["state"]["history"]
    return {"layout": name, "tokens/s": int(m[4].replace(",", "")),
            "train loss": float(history[-1]["loss"]), "val loss": float(m[3]),
            "train s": float(m[5]), "wall s": wall, "peak MiB/process": int(m[6].replace(",", ""))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=Bench.steps)
    ap.add_argument("--batch-size", type=int, default=Bench.batch_size)
    ap.add_argument("--preset", default=Bench.preset)
    ap.add_argument("--repeat", type=int, default=1, help="runs per layout, interleaved")
    a = ap.parse_args(argv)
    b = Bench(a.steps, a.batch_size, a.preset)
    runs: dict[str, list[dict]] = {name: [] for name in LAYOUTS}
    for _ in range(a.repeat):
        for name, extra in LAYOUTS.items():
            with tempfile.TemporaryDirectory() as tmp:
                runs[name].append(run(b, name, extra, Path(tmp)))
    rows = [median_run(rs) for rs in runs.values()]
    print(f"{b.preset}, {b.steps} steps x {b.batch_size} sequences, fp32, one thread per process, "
          f"{a.repeat} run(s) per layout")
    print("| layout | tokens/s (median) | range | vs 1 process | train loss | val loss | train s | "
          "wall s | peak MiB/process |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = rows[0]["tokens/s"]
    for r, rs in zip(rows, runs.values()):
        lo, hi = min(x["tokens/s"] for x in rs), max(x["tokens/s"] for x in rs)
        print(f"| {r['layout']} | {r['tokens/s']:,} | {lo:,}–{hi:,} | "
              f"{r['tokens/s'] / base:.2f}x | {r['train loss']:.4f} | {r['val loss']:.4f} | "
              f"{r['train s']:.1f} | {r['wall s']:.1f} | {r['peak MiB/process']:,} |")


def median_run(rs: list[dict]) -> dict:
    """The run with the median tokens/s (the lower middle one for an even count)."""
    return sorted(rs, key=lambda r: r["tokens/s"])[(len(rs) - 1) // 2]


if __name__ == "__main__":
    main()
