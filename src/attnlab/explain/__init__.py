"""Interpretation: the lesson replayed with computed numbers, and real models explained.

`attnlab.explain.model` (load_model, run_model) and `attnlab.explain.token` (explain_token) need
the `hf` extra for Hugging Face models; they are imported on use, not here. `lesson_page()` is the
lesson as an explorable page for Jupyter.
"""

import importlib as _importlib

from attnlab.explain.lesson_page import lesson_page

_LAZY = {"SECTIONS": "lesson", "build_lesson": "lesson", "head_stats": "heads",
         "rollout": "attention_flow", "flow": "attention_flow"}
__all__ = ["SECTIONS", "build_lesson", "flow", "head_stats", "lesson_page", "rollout"]


def __getattr__(name: str):  # imported on first use: `attnlab.explain.x` stays cheap to import
    if name not in _LAZY:
        raise AttributeError(f"module 'attnlab.explain' has no attribute {name!r}")
    return getattr(_importlib.import_module(f"attnlab.explain.{_LAZY[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
