"""AttnlabError and the input checks of the public boundary.

Every public function validates its arguments once, here, and raises `AttnlabError` with a message
that names the argument and shows the shapes or values it got. Kernels behind the boundary trust
their inputs and use `assert` only for internal invariants. Torch is imported by the checks that
need it, so the command line can import this module without paying for torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class AttnlabError(ValueError):
    """Bad input to an attnlab function. The message names the argument and shows what it got."""


def fmt_shape(shape) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


@dataclass(frozen=True)
class Dims:
    """The sizes of one attention call, in the glossary's names.

    `batch` holds the leading dims before the head dim (empty when the inputs are 2-D).
    """

    batch: tuple[int, ...]
    H: int
    Hkv: int
    L: int
    S: int
    D: int
    Dv: int
    ndim: int = 4

    @property
    def groups(self) -> int:
        """Query heads per key/value head (1 when there are no heads at all)."""
        return self.H // self.Hkv if self.Hkv else 1

    @property
    def scores_shape(self) -> tuple[int, ...]:
        if self.ndim == 2:
            return (self.L, self.S)
        return (*self.batch, self.H, self.L, self.S)


def _check_tensor(name: str, x) -> None:
    import torch

    if not isinstance(x, torch.Tensor):
        raise AttnlabError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise AttnlabError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < 2:
        raise AttnlabError(
            f"{name}: expected at least 2 dims (..., L, D), got shape {fmt_shape(x.shape)}"
        )


def check_qkv(query, key, value, *, enable_gqa: bool) -> Dims:
    """Check the three inputs against each other and return their sizes.

    `value=None` checks query and key only (the messages then name only those two). Leading
    batch dims broadcast as in SDPA (a key/value batch of 1 serves every query batch element);
    `Dims.batch` is the broadcast batch.
    """
    given = [("query", query), ("key", key)] + ([("value", value)] if value is not None else [])
    names = ", ".join(n for n, _ in given)
    for name, x in given:
        _check_tensor(name, x)
    if len({x.dim() for _, x in given}) > 1:
        raise AttnlabError(
            f"{names}: expected the same number of dims, got "
            + ", ".join(fmt_shape(x.shape) for _, x in given)
        )
    if len({x.dtype for _, x in given}) > 1:
        raise AttnlabError(f"{names}: expected one dtype, got "
                           + ", ".join(str(x.dtype) for _, x in given))
    if len({x.device for _, x in given}) > 1:
        raise AttnlabError(f"{names}: expected one device, got "
                           + ", ".join(str(x.device) for _, x in given))
    if query.device.type == "meta":
        raise AttnlabError(
            f"{names}: meta tensors hold no values to attend over; pass tensors on a real device"
        )
    value = key if value is None else value
    nd = query.dim()
    L, D = query.shape[-2:]
    S, Dv = key.shape[-2], value.shape[-1]
    if nd == 2:
        qb, H, Hkv = (), 1, 1
    else:
        qb, H, Hkv = tuple(query.shape[:-3]), query.shape[-3], key.shape[-3]
    batch = _broadcast(qb, tuple(key.shape[:-3]))
    head = ("B", "Hkv") if nd > 3 else ("Hkv",) if nd == 3 else ()
    want_k = (*qb, Hkv, S, D) if nd > 2 else (S, D)
    if batch is None or tuple(key.shape[-1:]) != (D,):
        names_k = "(" + ", ".join([*head, "S", "D"]) + ")" if nd <= 4 else "(..., Hkv, S, D)"
        also = f" and value {fmt_shape(value.shape)}" if len(given) == 3 else ""
        raise AttnlabError(
            f"key: expected {names_k} = {fmt_shape(want_k)} to match query "
            f"{fmt_shape(query.shape)}{also}, got {fmt_shape(key.shape)}"
        )
    want_v = (*qb, Hkv, S, Dv) if nd > 2 else (S, Dv)
    batch = _broadcast(batch, tuple(value.shape[:-3]))
    heads_len = 2 if nd > 2 else 1  # (Hkv, S) or (S,)
    if batch is None or tuple(value.shape[-1 - heads_len:-1]) != want_v[-1 - heads_len:-1]:
        raise AttnlabError(
            f"value: expected leading dims {fmt_shape(want_v[:-1])} to match key "
            f"{fmt_shape(key.shape)}, got {fmt_shape(value.shape)}"
        )
    if Hkv != H:
        if not enable_gqa:
            raise AttnlabError(
                f"key: has {Hkv} heads but query has {H} (query {fmt_shape(query.shape)}, key "
                f"{fmt_shape(key.shape)}); pass enable_gqa=True for grouped-query attention"
            )
        if Hkv == 0 or H % Hkv != 0:
            raise AttnlabError(
                f"enable_gqa: query heads H={H} must be a multiple of key/value heads Hkv={Hkv} "
                f"(query {fmt_shape(query.shape)}, key {fmt_shape(key.shape)})"
            )
    return Dims(batch=tuple(batch), H=H, Hkv=Hkv, L=L, S=S, D=D, Dv=Dv, ndim=nd)


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast of two batch shapes of equal length, or None when they don't broadcast."""
    if len(a) != len(b) or any(x != y and 1 not in (x, y) for x, y in zip(a, b)):
        return None
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def check_dense_mask(name: str, mask, dims: Dims, device) -> None:
    import torch

    if not isinstance(mask, torch.Tensor):
        raise AttnlabError(f"{name}: expected a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise AttnlabError(f"{name}: expected a bool or floating-point tensor, got {mask.dtype}")
    if mask.device != device:
        raise AttnlabError(f"{name}: expected device {device} like query, got {mask.device}")
    if not broadcasts_to(tuple(mask.shape), dims.scores_shape):
        raise AttnlabError(
            f"{name}: shape {fmt_shape(mask.shape)} does not broadcast to the scores "
            f"(..., H, L, S) = {fmt_shape(dims.scores_shape)}"
        )


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
