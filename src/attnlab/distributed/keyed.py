"""Keyed attention dropout: whether weight (b, h, i, j) is dropped is a pure function of
(seed, b, h, global query position i, global key position j).

So every rank, every layout, every strategy and every world size drops the same weights, and a
backward regenerates the forward's mask from the positions instead of storing anything L × S.

The hash is MurmurHash3's 32-bit finaliser (fmix32), a bijection of [0, 2³²), on int64 tensors
holding 32-bit values; each multiplication is split in 16-bit halves so no intermediate leaves
[0, 2⁴⁹) (no signed overflow on any device):

    hb, hh, hi, hj = F(b + s0), F(h + s1), F(i + s2), F(j + s3)   # s0..s3 derived from the seed
    r   = F(F(hb ^ hh) ^ hi)                                       # one key per (b, h, i) row
    x   = F(F(r ^ hj) + hj)                                        # all sums and xors mod 2³²
    keep = x >= round(p · 2³²)

Positions must be below 2³².
"""

from __future__ import annotations

import hashlib

import torch

M32 = 0xFFFFFFFF
_C1, _C2 = 0x85EBCA6B, 0xC2B2AE35
_SALTS = (0x9E3779B9, 0x7F4A7C15, 0x94D049BB, 0x2545F491)


def fmix32_int(x: int) -> int:
    """MurmurHash3's finaliser on a Python int in [0, 2³²) (the reference for `fmix32`)."""
    x &= M32
    x ^= x >> 16
    x = (x * _C1) & M32
    x ^= x >> 13
    x = (x * _C2) & M32
    return x ^ (x >> 16)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x · c) mod 2³² for int64 x in [0, 2³²): with x = hi·2¹⁶ + lo,
    x·c ≡ lo·c + (hi·c mod 2¹⁶)·2¹⁶ (mod 2³²), every term below 2⁴⁹."""
    return ((x & 0xFFFF) * c + (((x >> 16) * c) & 0xFFFF) * 65536) & M32


def fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's finaliser, elementwise on int64 values in [0, 2³²)."""
    x = x ^ (x >> 16)
    x = _mul32(x, _C1)
    x = x ^ (x >> 13)
    x = _mul32(x, _C2)
    return x ^ (x >> 16)


def _salts(seed: int) -> list[int]:
    """Four 32-bit keys from a 64-bit seed."""
    s = fmix32_int(fmix32_int((seed & M32) ^ _SALTS[0]) ^ ((seed >> 32) & M32))
    return [fmix32_int(s ^ c) for c in _SALTS]


def threshold(p: float) -> int:
    """Hash values below this are dropped: round(p · 2³²)."""
    return min(1 << 32, round(p * (1 << 32)))


def keep_mask(seed: int, p: float, batch: int, heads: torch.Tensor, rows: torch.Tensor,
              cols: torch.Tensor) -> torch.Tensor:
    """bool (batch, len(heads), len(rows), len(cols)): True where weight (b, h, i, j) survives
    dropout with probability p, for b in 0..batch-1, the query heads `heads` and the global query
    positions `rows`, key positions `cols` (int64 tensors, on the device the mask is wanted)."""
    s0, s1, s2, s3 = _salts(int(seed) & ((1 << 64) - 1))
    dev = rows.device
    hb = fmix32((torch.arange(batch, dtype=torch.int64, device=dev) + s0) & M32)  # (B,)
    hh = fmix32((heads.to(dev, torch.int64) + s1) & M32)  # (H,)
    hi = fmix32((rows.to(torch.int64) + s2) & M32)  # (Lb,)
    hj = fmix32((cols.to(dev, torch.int64) + s3) & M32)  # (Sb,)
    bh = fmix32(hb[:, None] ^ hh[None, :])  # (B, 1) ^ (1, H) -> (B, H)
    r = fmix32(bh[:, :, None] ^ hi)  # (B, H, 1) ^ (Lb,) -> (B, H, Lb)
    x = fmix32(r[..., None] ^ hj)  # (B, H, Lb, 1) ^ (Sb,) -> (B, H, Lb, Sb)
    x = fmix32((x + hj) & M32)
    return x >= threshold(p)


def step_seed(seed: int, step: int, layer: int, replica: int = 0) -> int:
    """A 63-bit dropout key for one layer at one training step of a run seeded `seed`, for
    data-parallel replica `replica` (replicas train on different rows: their masks differ)."""
    key = f"{seed}:{step}:{layer}" + (f":{replica}" if replica else "")
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
