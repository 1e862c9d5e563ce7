"""Interpretation: the lesson replayed with computed numbers, and real models explained.

`attnlab.explain.model` (load_model, run_model) and `attnlab.explain.token` (explain_token) need
the `hf` extra for Hugging Face models; they are imported on use, not here.
"""

from attnlab.explain.lesson import SECTIONS, build_lesson

__all__ = ["SECTIONS", "build_lesson"]
