"""AttnlabError, the one error type of attnlab, and the generic checks every part shares.

Every public function validates its arguments once, at its boundary, and raises `AttnlabError`
with a message that names the argument and shows the shapes or values it got (`fmt_shape`).
Kernels behind the boundary trust their inputs and use `assert` only for internal invariants.
The checks of argument kinds every part shares (numbers, probabilities, scale, softcap, ints,
ALiBi slopes) are here, one each; the attention op's own checks (query/key/value, dense masks)
live with the op, in `attnlab.ops.validate`. torch is imported only inside the tensor checks, so
the command line can import this module for free.
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


# One check per argument kind, shared by the op (`ops.validate`), the kernel API
# (`ops.kernels.gate`), context parallelism (`distributed.api`), the modules and the CLI; one
# rule: a number is a real number (int, float, a NumPy or 0-d tensor scalar), never a bool or a
# string, and NaN/Inf are refused wherever they mean nothing; one wording:
# "<argument>: expected <what>, got <value>".


def real_number(name: str, value, expected: str) -> float:
    """float(value) for a real number, else AttnlabError "name: expected ..., got value".

    Refused: bools (True is not 1.0 here), strings ("2.0" is not parsed), None, containers and
    tensors with more than one element. NaN/Inf pass: each caller says where they mean nothing.
    """
    if isinstance(value, (bool, str, bytes)) or "bool" in str(getattr(value, "dtype", "")):
        raise AttnlabError(f"{name}: expected {expected}, got {value!r}")
    if not hasattr(type(value), "__float__"):
        raise AttnlabError(f"{name}: expected {expected}, got {_show(value)}")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # a tensor of several elements
        raise AttnlabError(f"{name}: expected {expected}, got {_show(value)}") from None


def _show(value) -> str:
    shape = getattr(value, "shape", None)
    return f"{type(value).__name__} of shape {fmt_shape(shape)}" if shape is not None else \
        repr(value)


def check_dropout(dropout_p, name: str = "dropout_p", *, below_one: bool = False) -> float:
    """A dropout probability in [0, 1] (1.0 drops every weight: output 0, as SDPA), or [0, 1)
    with `below_one` (where dropping everything has no gradient to replay)."""
    want = "a probability in [0, 1)" if below_one else "a probability in [0, 1]"
    p = real_number(name, dropout_p, want)
    if not (0.0 <= p < 1.0 if below_one else 0.0 <= p <= 1.0):  # NaN fails both
        raise AttnlabError(f"{name}: expected {want}, got {dropout_p!r}")
    return p


def check_positive_int(name: str, value) -> int:
    """`value` when it is an int >= 1 (not a bool), else AttnlabError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AttnlabError(f"{name}: expected a positive int, got {value!r}")
    return value


def check_int(name: str, value, *, none: bool = False) -> int | None:
    """`value` when it is an int (not a bool; a NumPy integer too), or None with `none`."""
    if value is None and none:
        return None
    want = "an int or None" if none else "an int"
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise AttnlabError(f"{name}: expected {want}, got {value!r}")
    try:
        return int(value.__index__())
    except (TypeError, RuntimeError):  # a float or multi-element tensor
        raise AttnlabError(f"{name}: expected {want}, got {_show(value)}") from None


def check_scale(scale, D: int, *, required: bool = False) -> float:
    """The score scale: a finite number; None gives 1/sqrt(D) (1 when D = 0) unless `required`
    (the kernel API, which has no head dim to default from)."""
    want = "a finite number" if required else "a finite number or None"
    if scale is None and not required:
        return 1.0 / math.sqrt(D) if D > 0 else 1.0
    s = real_number("scale", scale, want) if scale is not None else math.nan
    if not math.isfinite(s):
        raise AttnlabError(f"scale: expected {want}, got {scale!r}")
    return s


def check_softcap(softcap) -> float | None:
    """The tanh soft-cap: a positive finite number, or None (no cap)."""
    if softcap is None:
        return None
    c = real_number("softcap", softcap, "a positive finite number or None")
    if not 0.0 < c < math.inf:
        raise AttnlabError(f"softcap: expected a positive finite number or None, got {softcap!r}")
    return c


def check_finite(name: str, t) -> None:
    """AttnlabError naming `name` and showing the values when the tensor t holds NaN or ±Inf: a
    slope or sink of inf/nan gives each backend its own answer for that head (inf - inf, 0 · inf).
    One small reduction (a host sync on a device: the tensors checked here have H entries)."""
    import torch

    if t.numel() and not bool(torch.isfinite(t.detach()).all()):
        idx = (~torch.isfinite(t.detach())).nonzero().tolist()[:8]  # (n, ndim) positions
        bad = [i[0] if len(i) == 1 else tuple(i) for i in idx]
        raise AttnlabError(f"{name}: expected finite values, got {t.detach().cpu().tolist()}"[:300]
                           + f" (non-finite at index {bad})")


def check_slopes(name: str, slopes, H: int, *, B: int | None = None, device=None):
    """ALiBi slopes: a floating-point tensor of shape (H,) (or (B|1, H) when B is given), on
    `device` when given, every slope finite. Returns it unchanged."""
    import torch

    shapes = f"(H,) = ({H},)" + ("" if B is None else f" or (B, H) = ({B}, {H}) (or B = 1)")
    if not isinstance(slopes, torch.Tensor) or not slopes.is_floating_point():
        got = f"{type(slopes).__name__} {getattr(slopes, 'dtype', '')}".rstrip()
        raise AttnlabError(f"{name}: expected a float tensor of shape {shapes}, got {got}")
    ok = tuple(slopes.shape) == (H,) or (
        B is not None and slopes.dim() == 2 and slopes.shape[0] in (1, B) and slopes.shape[1] == H)
    if not ok:
        raise AttnlabError(f"{name}: expected shape {shapes}, got {fmt_shape(slopes.shape)}")
    if device is not None and slopes.device != torch.device(device):
        raise AttnlabError(f"{name}: expected device {device} like query, got {slopes.device}")
    check_finite(name, slopes)
    return slopes


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise AttnlabError(f"{name}: expected one of {sorted(choices)}, got {value!r}")
