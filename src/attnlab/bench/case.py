"""What one benchmark cell is: the mask, dtype and mode names, a `Case` with its useful FLOPs, and
the `Result` of timing one implementation on it. Plain data, no torch: the command line lists
these names without loading torch."""

from __future__ import annotations

from dataclasses import dataclass

MASKS = ("full", "causal", "sliding256", "document8")
DTYPES = ("fp32", "bf16")
MODES = ("fwd", "fwd+bwd")
PEERS = ("sdpa", "naive", "flex")


@dataclass(frozen=True)
class Case:
    L: int
    mask: str
    dtype: str
    mode: str
    B: int = 1
    H: int = 8
    D: int = 64

    @property
    def pairs(self) -> int:
        """Unmasked (query, key) pairs per batch element and head: the useful work."""
        L = self.L
        if self.mask == "full":
            return L * L
        if self.mask == "causal":
            return L * (L + 1) // 2
        if self.mask == "sliding256":
            w = min(256, L)
            return w * (w + 1) // 2 + (L - w) * w
        n = -(-L // 8)  # document8: 8 equal documents (the last may be shorter)
        sizes = [min(n, L - i * n) for i in range(8) if L - i * n > 0]
        return sum(s * s for s in sizes)

    @property
    def flops(self) -> float:
        f = 4.0 * self.B * self.H * self.D * self.pairs
        return f * (3.5 if self.mode == "fwd+bwd" else 1.0)


@dataclass
class Result:
    impl: str
    ms: float | None = None
    gflops: float | None = None
    peak_mib: float | None = None
    note: str = ""
