"""The gate of the interval kernel: checks, and the layouts and dtype the C++ code reads.

Everything the kernel cannot take as given is made here, once per call: fp32 copies of inputs
in other dtypes or whose rows are not contiguous (any batch and head strides are read in
place), Kᵀ (and Vᵀ for the backward) with the key dimension contiguous in chunks of 16 keys,
k and v rows padded to a multiple of 16 floats.
These copies cost O(S·D); the attention they serve costs O(L·S·D) or O(L·w·D).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.errors import (
    AttnlabError,
    check_int,
    check_scale,
    check_slopes,
    check_softcap,
    fmt_shape,
)
from attnlab.ops.problem import Dims

PAD = 16  # csrc/interval.h: PAD
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True, kw_only=True)
class Call(Dims):
    """One checked call: the Dims of a (B, H, ·, ·) call (batch = (B,)), the interval arrays and
    modifiers in the kernel's form."""

    lo: torch.Tensor  # int32 (B|1, H|1, L), contiguous
    hi: torch.Tensor
    scale: float
    softcap: float  # 0.0: none
    slopes: torch.Tensor | None  # float32 (B|1, H), contiguous
    pos_off: int  # k_pos0 - q_pos0

    @property
    def B(self) -> int:
        return self.batch[0]

    @property
    def empty(self) -> bool:
        return min(self.B, self.H, self.L, self.S) == 0


def check(q, k, v, lo, hi, *, scale, softcap=None, alibi=None, q_pos0=0, k_pos0=0,
          values: bool = True) -> Call:
    """A Call from the public arguments, or AttnlabError naming the one that is wrong (values
    False: a call that reads no values, the weights', and v is None)."""
    for name, x in (("q", q), ("k", k), ("v", v))[:3 if values else 2]:
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            got = fmt_shape(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise AttnlabError(f"{name}: expected a 4-d tensor (B, H, ·, ·), got {got}")
        if x.dtype not in DTYPES:
            raise AttnlabError(f"{name}: the interval kernel takes float32, float16 or bfloat16, "
                               f"got {x.dtype}")
        if x.device.type != "cpu":
            raise AttnlabError(f"{name}: the interval kernel runs on the CPU, got {x.device}")
    for name, x in (("k", k), ("v", v))[:2 if values else 1]:
        if x.dtype != q.dtype:
            raise AttnlabError(f"{name}: expected q's dtype {q.dtype}, got {x.dtype} (convert "
                               "q, k and v to one dtype)")
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if tuple(k.shape) != (B, Hkv, S, D) or Hkv == 0 or H % Hkv:
        raise AttnlabError(f"k: expected (B, Hkv, S, D) = ({B}, Hkv, S, {D}) with H = {H} a "
                           f"multiple of Hkv, got {fmt_shape(k.shape)}")
    if values and tuple(v.shape[:3]) != (B, Hkv, S):
        raise AttnlabError(f"v: expected (B, Hkv, S, Dv) = ({B}, {Hkv}, {S}, Dv), got "
                           f"{fmt_shape(v.shape)}")
    lo32, hi32 = _intervals(lo, hi, B, H, L, S)
    scale = check_scale(scale, D, required=True)  # nan or inf would zero every row
    softcap = check_softcap(softcap)
    pos_off = check_int("k_pos0", k_pos0) - check_int("q_pos0", q_pos0)
    if abs(pos_off) + L + S >= 2**31:
        raise AttnlabError(f"q_pos0, k_pos0: positions must stay below 2**31, got {q_pos0}, "
                           f"{k_pos0}")
    return Call((B,), H, Hkv, L, S, D, v.shape[3] if values else 0, lo=lo32, hi=hi32, scale=scale,
                softcap=softcap or 0.0, slopes=slopes(alibi, B, H), pos_off=pos_off)


def check_outputs(c: Call, out, lse, dout, dlse) -> None:
    """The backward's out, dout (B, H, L, Dv) and lse, dlse (B, H, L) (dlse may be None): CPU
    tensors of those shapes, floating point, or AttnlabError naming the one that is not."""
    full, rows = (c.B, c.H, c.L, c.Dv), (c.B, c.H, c.L)
    for name, x, want in (("out", out, full), ("lse", lse, rows), ("dout", dout, full),
                          ("dlse", dlse, rows)):
        if x is None and name == "dlse":
            continue
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != want:
            got = fmt_shape(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            dims = "(B, H, L, Dv)" if len(want) == 4 else "(B, H, L)"
            raise AttnlabError(f"{name}: expected {dims} = {fmt_shape(want)}, got {got}")
        if not x.is_floating_point() or x.device.type != "cpu":
            raise AttnlabError(f"{name}: expected a floating-point CPU tensor, got {x.dtype} on "
                               f"{x.device}")


def _intervals(lo, hi, B, H, L, S):
    shapes = []
    for name, x in (("lo", lo), ("hi", hi)):
        if not isinstance(x, torch.Tensor) or x.is_floating_point() or x.dtype == torch.bool:
            raise AttnlabError(f"{name}: expected an integer tensor (B|1, H|1, L), got "
                               f"{getattr(x, 'dtype', type(x).__name__)}")
        if x.dim() != 3 or x.shape[0] not in (1, B) or x.shape[1] not in (1, H) or \
                x.shape[2] != L:
            raise AttnlabError(f"{name}: expected (B|1, H|1, L) with (B, H, L) = ({B}, {H}, "
                               f"{L}), got {fmt_shape(x.shape)}")
        shapes.append(tuple(x.shape))
    if shapes[0] != shapes[1]:
        lo, hi = torch.broadcast_tensors(lo, hi)
    live = lo < hi
    if bool((live & ((lo < 0) | (hi > S))).any()):
        bad = live & ((lo < 0) | (hi > S))
        raise AttnlabError(f"lo, hi: a row's keys must lie in [0, S = {S}); got lo in "
                           f"[{int(lo[bad].min())}, ...], hi up to {int(hi[bad].max())}")
    # a row with nothing (lo >= hi, any values: 2**32 would wrap to 0 in int32) becomes (0, 0)
    lo, hi = torch.where(live, lo, 0), torch.where(live, hi, 0)
    return (lo.to(torch.int32).contiguous(), hi.to(torch.int32).contiguous())


def slopes(alibi, B: int, H: int) -> torch.Tensor | None:
    """ALiBi slopes (H,) or (B, H) as float32 (B|1, H), contiguous; None stays None."""
    if alibi is None:
        return None
    try:
        s = torch.as_tensor(alibi, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        raise AttnlabError(f"alibi: expected slopes (H,) or (B, H) of numbers, got "
                           f"{alibi!r}"[:200]) from None
    check_slopes("alibi", s, H, B=B)
    if s.dim() == 1:
        s = s[None]
    return s.to(torch.float32).contiguous()  # (B|1, H)


def dense(x: torch.Tensor) -> torch.Tensor:
    """x as float32 contiguous (x itself when it already is)."""
    if x.dtype == torch.float32 and x.is_contiguous():
        return x
    return x.to(torch.float32).contiguous()


def rows(x: torch.Tensor) -> torch.Tensor:
    """(B, H, n, m) as float32 whose every head's rows are contiguous, any batch and head strides
    (what the kernel reads in place): x itself when it already is, e.g. rows [a, b) of every
    head of a larger tensor, a context-parallel block's view of its shard; else a copy."""
    if x.dtype != torch.float32:
        x = x.to(torch.float32)
    return x if in_place(x) else x.contiguous()


def in_place(x: torch.Tensor) -> bool:
    """The kernel reads x (B, H, n, m) as it is: float32, every head's rows contiguous."""
    n, m = x.shape[-2:]
    return x.dtype == torch.float32 and (m <= 1 or x.stride(3) == 1) and \
        (n <= 1 or x.stride(2) == m)


def padded_width(n: int) -> int:
    """n rounded up to a multiple of PAD: the row length of k and v the kernel reads, and the
    keys of Kᵀ in whole chunks."""
    return -(-n // PAD) * PAD


def rows_padded(x: torch.Tensor) -> torch.Tensor:
    """(B, Hkv, S, n) -> float32 (B, Hkv, S, n padded to PAD), the padding zero (the layout the
    compiled `rows_padded` op makes on the kernel's threads; this one is its test oracle)."""
    n = x.shape[-1]
    width = padded_width(n)
    if width == n:
        return rows(x)
    out = x.new_empty(*x.shape[:-1], width, dtype=torch.float32)
    out[..., :n] = x
    out[..., n:] = 0
    return out


def keys_last(x: torch.Tensor) -> torch.Tensor:
    """(B, Hkv, S, n) -> float32 (B, Hkv, S16/PAD, n, PAD), S16 = S padded to PAD with zero keys
    (the layout the compiled `keys_last` op makes, ~6x faster; this one is its test oracle):
    Kᵀ in chunks of PAD keys, the keys of one dimension contiguous (csrc/tiles.h: chunked)."""
    B, Hkv, S, n = x.shape
    width = padded_width(S)
    out = x.new_empty(B, Hkv, width // PAD, n, PAD, dtype=torch.float32)
    full = S // PAD * PAD
    out[:, :, :S // PAD] = x[:, :, :full].reshape(B, Hkv, S // PAD, PAD, n).transpose(-2, -1)
    if full < S:  # the last, partial chunk: zero keys after S
        tail = x.new_zeros(B, Hkv, PAD, n, dtype=torch.float32)
        tail[:, :, :S - full] = x[:, :, full:]
        out[:, :, -1] = tail.transpose(-2, -1)
    return out
