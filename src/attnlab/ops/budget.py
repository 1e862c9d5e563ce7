"""The memory limit of the dense paths: refuse before allocating, not die in the allocator.

The math and reference backends, the sdpa backend with a mask it must build densely, and
`attention_weights` for many rows hold (..., H, L, S)-sized intermediates. Past a limit they raise
`AttnlabError` before allocating anything, stating the bytes needed and the path that fits
(the tiled backend, memory linear in L; weights in row blocks).

The limit: the environment variable ATTNLAB_MAX_DENSE_BYTES (bytes; "inf" for none) when set,
else min(4 GiB, half the machine's physical memory). The estimates count every L×S-sized buffer
a path keeps alive at its peak (scores, masked scores, exponentials, weights, masks).
"""

from __future__ import annotations

import functools
import math
import os

from attnlab.errors import AttnlabError, fmt_shape

ENV = "ATTNLAB_MAX_DENSE_BYTES"
DEFAULT_CAP = 4 * 2**30


@functools.cache
def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def limit() -> float:
    """Bytes a dense path may take (see the module docstring)."""
    env = os.environ.get(ENV, "").strip()
    if env:
        if env.lower() in ("inf", "none"):
            return math.inf
        try:
            n = int(env)
        except ValueError:
            raise AttnlabError(
                f"{ENV}: expected a number of bytes or 'inf', got {env!r}") from None
        if n < 0:
            raise AttnlabError(f"{ENV}: expected a number of bytes >= 0, got {env!r}")
        return n
    phys = physical_memory()
    return DEFAULT_CAP if phys is None else min(DEFAULT_CAP, phys // 2)


def fmt_bytes(n: float) -> str:
    if n == math.inf:
        return "no limit"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} bytes"


def check(arg: str, what: str, shape, nbytes: int, fits: str) -> None:
    """Raise AttnlabError when `nbytes` of (..., H, L, S)-sized buffers exceed the limit."""
    lim = limit()
    if nbytes > lim:
        raise AttnlabError(
            f"{arg}: {what} needs about {fmt_bytes(nbytes)} for its {fmt_shape(shape)} "
            f"score-sized buffers, over the limit of {fmt_bytes(lim)} ({ENV}); {fits}"
        )


def entries(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
