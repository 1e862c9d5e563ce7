"""Whether and which build of the interval kernel runs here: ATTNLAB_KERNEL (on or off), the
CPU's features, the ISA builds it can run and the one chosen (ATTNLAB_KERNEL_ISA, else the best);
and KernelUnavailable, the error callers catch to fall back to the PyTorch path.

Each ISA's compile flags are `build.ISA_FLAGS`; this file holds what a CPU needs to run its build.
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

from attnlab.errors import AttnlabError

ISAS = ("avx512", "avx2", "scalar")
#: the /proc/cpuinfo flags an ISA's build needs
ISA_NEEDS = {
    "avx512": {"avx512f", "avx512dq", "avx512bw", "avx512vl", "avx2", "fma", "f16c"},
    "avx2": {"avx2", "fma", "f16c"},
    "scalar": set(),
}


class KernelUnavailable(AttnlabError, RuntimeError):
    """The interval kernel cannot be had here (no compiler, a failed build, an ISA this CPU lacks,
    the kernel turned off); callers fall back to the PyTorch path."""


#: the process environment's own dict (bytes -> bytes) where there is one (POSIX), else os.environ
#: itself, and the kernel's switches' names as its keys: every kernel call asks the switches (a
#: decode step several times, the cheap paths' signatures every call), and os.environ.get encodes
#: the name and decodes the value each time (os.environ's writes, monkeypatch's included, update
#: this dict)
_RAW = getattr(os.environ, "_data", None) if os.name == "posix" else None
ENV = os.environ if _RAW is None else _RAW
KERNEL_KEY, ISA_KEY = (b"ATTNLAB_KERNEL", b"ATTNLAB_KERNEL_ISA") if _RAW is not None else \
    ("ATTNLAB_KERNEL", "ATTNLAB_KERNEL_ISA")


def _env(name: str) -> str:
    """os.environ.get(name, "")."""
    if _RAW is None:
        return os.environ.get(name, "")
    value = _RAW.get(name.encode())
    return "" if value is None else os.fsdecode(value)


def switches() -> tuple:
    """(ATTNLAB_KERNEL, ATTNLAB_KERNEL_ISA) as stored in ENV (None when not set): what a plan
    kept for later calls must have seen (`ops/cheap.py`, `ops/decode_steps.py`)."""
    return ENV.get(KERNEL_KEY), ENV.get(ISA_KEY)


def enabled() -> bool:
    return (_env("ATTNLAB_KERNEL") or "1").strip().lower() not in ("0", "off", "false", "no")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; else what PyTorch's own dispatch found),
    read once per process: every call that picks a build asks."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    import torch

    cap = torch.backends.cpu.get_cpu_capability().upper()
    return frozenset().union(*(ISA_NEEDS[i] for i in ISAS if cap.startswith(i.upper())))


def runnable() -> tuple[str, ...]:
    """The ISA builds this CPU can run, best first ("scalar" always)."""
    flags = cpu_flags()
    return tuple(i for i in ISAS if ISA_NEEDS[i] <= flags)


def lacking(isa: str) -> list[str]:
    """The CPU flags the `isa` build needs that this CPU lacks, sorted (none: it runs here)."""
    return sorted(ISA_NEEDS[isa] - cpu_flags())


def chosen_isa() -> str:
    """ATTNLAB_KERNEL_ISA if set, else the best build this CPU runs."""
    forced = _env("ATTNLAB_KERNEL_ISA").strip().lower()
    if forced:
        if forced not in ISAS:
            raise AttnlabError(f"ATTNLAB_KERNEL_ISA: expected one of {ISAS}, got {forced!r}")
        return forced
    return runnable()[0]
