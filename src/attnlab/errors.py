"""AttnlabError, the one error type of attnlab, and the generic checks every part shares.

Every public function validates its arguments once, at its boundary, and raises `AttnlabError`
with a message that names the argument and shows the shapes or values it got (`fmt_shape`).
Kernels behind the boundary trust their inputs and use `assert` only for internal invariants.
The attention op's own checks (query/key/value, dense masks) live with the op, in
`attnlab.ops.validate`. No torch here, so the command line can import this module for free.
"""

from __future__ import annotations

import math


class AttnlabError(ValueError):
    """Bad input to an attnlab function. The message names the argument and shows what it got."""


def fmt_shape(shape) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


def broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """True when `shape` broadcasts to `target` without growing it (extra leading 1s are fine)."""
    extra = len(shape) - len(target)
    if extra > 0:
        if any(s != 1 for s in shape[:extra]):
            return False
        shape = shape[extra:]
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def check_dropout(dropout_p) -> float:
    try:
        p = float(dropout_p)
    except (TypeError, ValueError):
        raise AttnlabError(f"dropout_p: expected a number in [0, 1], got {dropout_p!r}") from None
    if not 0.0 <= p <= 1.0:  # 1.0 drops every weight: output 0, as SDPA
        raise AttnlabError(f"dropout_p: expected a number in [0, 1], got {dropout_p!r}")
    return p


def check_positive_int(name: str, value) -> int:
    """`value` when it is an int >= 1 (not a bool), else AttnlabError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AttnlabError(f"{name}: expected a positive int, got {value!r}")
    return value


def check_scale(scale, D: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(D) if D > 0 else 1.0
    try:
        s = float(scale)
    except (TypeError, ValueError):
        raise AttnlabError(f"scale: expected a finite number or None, got {scale!r}") from None
    if not math.isfinite(s):
        raise AttnlabError(f"scale: expected a finite number or None, got {scale!r}")
    return s


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise AttnlabError(f"{name}: expected one of {sorted(choices)}, got {value!r}")
