"""Prebuilt interval kernels shipped inside a wheel (`make wheel`), loaded with no compiler.

A wheel built by `tools/build_wheel.py` carries, next to this file,

    prebuilt/manifest.json          {"torch": "2.13.0+cpu", "libraries": {isa: {"file": ...,
                                      "build_key": ..., "sha256": ...}}}
    prebuilt/<library>.so           one per ISA: avx512, avx2, scalar

each library compiled from this package's own sources for the torch the wheel was built against.
`library(isa)` hands `build` the one for the ISA chosen at run time when its build key (the
sources' hash, the flags and the torch version: `build.build_key`) is the running one's and its
bytes have the sha256 the manifest recorded (`trust.check_hash`); otherwise None, and the kernel
is built on first use as without a wheel (another torch: a new build, never a stale library).

Why per-torch libraries and not one across torch versions (LibTorch's stable ABI, torch >= 2.10):
the kernel's glue uses ATen's thread pool (`at::parallel_for` and its thread count), a pool of
freed buffers handed to PyTorch with `from_blob` and the dispatch-mode TLS (so that a Python
dispatch mode sees its buffers), none of which the stable C shim offers; the compute code needs
none of it, and a rebuild for another torch is one minute, once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FOLDER = Path(__file__).with_name("prebuilt")
MANIFEST = "manifest.json"


def manifest(folder: Path = FOLDER) -> dict | None:
    """The wheel's manifest, or None when this install carries no prebuilt kernels."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def library(isa: str, folder: Path = FOLDER) -> Path | None:
    """The verified prebuilt library of `isa` for the running torch and sources, or None (no
    wheel libraries, none for this ISA, or built for another torch or other sources). Raises
    trust.Untrusted when the library is there for this torch but its bytes are not the ones
    recorded (truncated, modified)."""
    from attnlab.ops.kernels import build, trust

    m = manifest(folder)
    entry = (m or {}).get("libraries", {}).get(isa)
    if entry is None or entry.get("build_key") != build.build_key(isa):
        return None
    lib = folder / entry["file"]
    if not lib.is_file():
        raise trust.Untrusted(f"{lib}: listed in the wheel's manifest but missing",
                              foreign=False)
    trust.check_hash(lib, entry["sha256"])
    return lib


def stage(folder: Path, isas=None) -> dict:
    """Build (or take from the cache, verified) each ISA's library for this torch and copy it
    into `folder` with a manifest; the wheel builder's step. Returns the manifest.

    Every ISA is built on this machine, so it must run them all (an AVX-512 CPU runs the three);
    KernelUnavailable says which one could not be had, and why."""
    import torch

    from attnlab.ops.kernels import build, trust

    folder.mkdir(parents=True, exist_ok=True)
    libs = {}
    for isa in isas or build.ISAS:
        src = build.library_path(isa)  # built and verified (trust) on the way
        shutil.copyfile(src, folder / src.name)
        libs[isa] = {"file": src.name, "build_key": build.build_key(isa),
                     "sha256": trust.sha256_file(folder / src.name)}
    m = {"torch": torch.__version__, "libraries": libs}
    (folder / MANIFEST).write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
    return m
