"""Interpretation: the lesson replayed with computed numbers, and (later) real models explained."""

from attnlab.explain.lesson import SECTIONS, build_lesson

__all__ = ["SECTIONS", "build_lesson"]
