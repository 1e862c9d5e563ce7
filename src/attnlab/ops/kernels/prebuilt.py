"""Prebuilt interval kernels shipped inside a wheel (`make wheel`), loaded with no compiler.

A wheel built by `tools/build_wheel.py` carries, next to this file,

    prebuilt/manifest.json          {"torch": "2.13.0+cpu", "libraries": {isa: {"file": ...,
                                      "build_key": ..., "sha256": ...}}}
    prebuilt/<library>.so           one per ISA: avx512, avx2, scalar

each library compiled from this package's own sources for the torch the wheel was built against.
`library(isa, key)` hands `build` the one for the ISA chosen at run time when its build key (the
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
from pathlib import Path

FOLDER = Path(__file__).with_name("prebuilt")
MANIFEST = "manifest.json"


def manifest(folder: Path = FOLDER) -> dict | None:
    """The wheel's manifest, or None when this install carries no prebuilt kernels."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def library(isa: str, key: str, folder: Path = FOLDER) -> Path | None:
    """The verified prebuilt library of `isa` when its build key is `key` (the running sources'
    and torch's, `build.build_key(isa)`), else None (no wheel libraries, none for this ISA, or
    built for another torch or other sources). Raises trust.Untrusted when the library is there
    for this key but its bytes are not the ones recorded (truncated, modified)."""
    from attnlab.ops.kernels import trust

    entry = (manifest(folder) or {}).get("libraries", {}).get(isa)
    if entry is None or entry.get("build_key") != key:
        return None
    lib = folder / entry["file"]
    if not lib.is_file():
        raise trust.Untrusted(f"{lib}: listed in the wheel's manifest but missing",
                              foreign=False)
    trust.check_hash(lib, entry["sha256"])
    return lib


def write_manifest(folder: Path, torch_version: str, libraries: dict[str, tuple[Path, str]]):
    """Write `folder`/manifest.json for libraries {isa: (library file in folder, build key)},
    each with its sha256; the wheel builder's last step (`tools/build_wheel.py`)."""
    from attnlab.ops.kernels import trust

    libs = {isa: {"file": lib.name, "build_key": key, "sha256": trust.sha256_file(lib)}
            for isa, (lib, key) in libraries.items()}
    m = {"torch": torch_version, "libraries": libs}
    (folder / MANIFEST).write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
    return m
