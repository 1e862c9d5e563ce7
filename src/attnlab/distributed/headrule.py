"""How the heads split over ranks for Ulysses (and the head part of hybrid): the one rule (P
divides the query heads; key/value heads are replicated up to lcm(Hkv, P)), the reason a split
does not apply, and the bytes the head all-to-alls move."""

from __future__ import annotations

import math


def ulysses_kv_heads(Hkv: int, P: int) -> int:
    """Key/value heads that travel in an all-to-all over P ranks: lcm(Hkv, P). Hkv itself when P
    divides it; otherwise each head is replicated lcm/Hkv times (P a multiple of Hkv: P/Hkv
    copies, one per rank), so every rank gets whole heads for its H/P query heads (lcm(Hkv, P)
    divides H whenever P and Hkv do)."""
    return Hkv * P // math.gcd(Hkv, P)


def ulysses_why_not(H: int, Hkv: int, P: int, per_head_mask: bool, over: str = "world") -> str:
    """Why the head split does not go over P ranks ("" when it does); `over` names P. The only
    head rule: P divides H (key/value heads then always split, replicated to lcm(Hkv, P))."""
    if H % P:
        return (f"needs query heads H = {H} divisible by {over} = {P} (each rank attends H/{P} "
                f"whole heads; key/value heads Hkv = {Hkv} are replicated as needed; uneven "
                f"head splits are not supported)")
    return "a per-head mask cannot be split by heads" if per_head_mask else ""


def ulysses_moved(B, H, K, D, Dv, nq, n, P, e, a) -> int:
    """Bytes one rank sends (and receives) in a pass of the head all-to-alls over P ranks: q
    (B, H, nq, D), k and v (B, K, n, D|Dv) with K = ulysses_kv_heads, and out with the lse
    (B, H, nq, Dv + a/e) — (P−1)/P of each; the backward moves their gradients, the same."""
    tensors = [B * H * nq * D * e, B * K * n * D * e, B * K * n * Dv * e, B * H * nq * Dv * e,
               B * H * nq * a]  # the lse travels in the accumulation dtype
    return sum((P - 1) * t // P for t in tensors)


def hybrid_why_not(H: int, Hkv: int, P: int, U: int | None, per_head_mask: bool) -> str:
    if U is None:
        return "needs ulysses_size=U, the ranks of a group (a divisor of world)"
    if isinstance(U, bool) or not isinstance(U, int) or U < 1 or P % U:
        return f"needs ulysses_size U dividing world = {P}, got {U!r}"
    return ulysses_why_not(H, Hkv, U, per_head_mask, over="ulysses_size U")
