"""Checks at the viz boundary: layer/head/token indices into a capture (its shapes are checked
by `attnlab.capture.check_capture`)."""

from __future__ import annotations

from attnlab.errors import AttnlabError


def check_index(name: str, value, n: int, what: str) -> int:
    """`value` as an index into `n` things (negative counts from the end, like Python)."""
    try:
        i = int(value)
    except (TypeError, ValueError):
        raise AttnlabError(f"{name}: expected an integer, got {value!r}") from None
    if isinstance(value, bool) or i != value or not -n <= i < n:
        raise AttnlabError(f"{name}: expected 0..{n - 1} (there are {n} {what}), got {value!r}")
    return i % n
