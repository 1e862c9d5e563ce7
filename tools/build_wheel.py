"""Build attnlab's platform wheel with the interval kernel inside (what `make wheel` runs).

    python tools/build_wheel.py [--out dist] [--isa avx512 avx2 scalar]

Copies the package sources to a temporary folder (the tree stays clean), stages there the
kernel's prebuilt libraries for the running torch, one per ISA, each built once into (or taken,
hash-checked, from) the kernel cache (`attnlab.ops.kernels.prebuilt.stage`), and runs
`pip wheel` on the copy: no dependency is downloaded, torch least of all. The wheel is tagged for
this Python and platform (setup.py); installed, it loads the library of the ISA its CPU runs with
no compiler, and builds on first use, as without it, under another torch.

Caution: every ISA is built on this machine, so build the wheel on a CPU that runs them all
(AVX-512: avx512, avx2 and scalar).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("pyproject.toml", "setup.py", "README.md", "LICENSE")


def stage(folder: Path, isas=None) -> dict:
    """Each ISA's library for this torch, built once into the kernel cache (or taken from it,
    verified by `trust`), copied into `folder` with the manifest; returns the manifest.
    KernelUnavailable says which ISA could not be had, and why."""
    import torch

    from attnlab.ops.kernels import build, prebuilt
    from attnlab.ops.kernels.isa import ISAS

    folder.mkdir(parents=True, exist_ok=True)
    libs = {}
    for isa in isas or ISAS:
        lib = build.library_path(isa)
        shutil.copyfile(lib, folder / lib.name)
        libs[isa] = (folder / lib.name, build.build_key(isa))
    return prebuilt.write_manifest(folder, torch.__version__, libs)


def build(out: Path, isas=None) -> Path:
    """The path of the wheel built into `out`."""

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="attnlab-wheel-") as tmp:
        src = Path(tmp) / "attnlab"
        src.mkdir()
        for name in FILES:
            shutil.copy(ROOT / name, src / name)
        shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns(
            "__pycache__", "*.egg-info", "prebuilt"))
        m = stage(src / "src" / "attnlab" / "ops" / "kernels" / "prebuilt", isas)
        before = set(out.glob("attnlab-*.whl"))
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index",
                        "--no-build-isolation", "--disable-pip-version-check", "-q",
                        "-w", str(out), str(src)], check=True, cwd=tmp)
        wheel = max(set(out.glob("attnlab-*.whl")) - before or out.glob("attnlab-*.whl"),
                    key=lambda p: p.stat().st_mtime)
    print(f"{wheel}  (kernel for torch {m['torch']}: {', '.join(m['libraries'])})")
    return wheel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "dist")
    ap.add_argument("--isa", nargs="+", default=None, help="default: avx512 avx2 scalar")
    args = ap.parse_args()
    build(args.out, args.isa)


if __name__ == "__main__":
    main()
