"""Interpretation: the lesson replayed with computed numbers, and real models explained.

`attnlab.explain.model` (load_model, run_model) and `attnlab.explain.token` (explain_token) need
the `hf` extra for Hugging Face models; they are imported on use, not here. `lesson_page()` is the
lesson as an explorable page for Jupyter.
"""

from attnlab.explain.lesson import SECTIONS, build_lesson
from attnlab.explain.lesson_page import lesson_page

__all__ = ["SECTIONS", "build_lesson", "lesson_page"]
