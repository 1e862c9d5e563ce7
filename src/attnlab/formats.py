"""How numbers read in text: percentages and short vectors, one spelling for every report."""

from __future__ import annotations


def pct(x: float, width: int = 5) -> str:
    """A weight as a percentage with one decimal, right-aligned in `width` characters
    (0 = no padding): pct(0.0731) == "  7.3%"."""
    return f"{100 * x:{width}.1f}%"


def vec(v) -> str:
    """A short vector, three significant digits per number: vec([1, 0.25]) == "[1, 0.25]"."""
    return "[" + ", ".join(f"{x:.3g}" for x in v) + "]"
