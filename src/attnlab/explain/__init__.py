"""Interpretation: computes everything a view shows, into records that `attnlab.viz` draws.

- `lesson_sections` (+ `lesson_check`): the lesson's steps replayed with computed numbers:
  compare, normalize, scale, borrow, mask, then heads and check;
- `model`: `load_model` / `run_model`, a real model's attention as a `ModelAttention` (Hugging
  Face models need the `hf` extra, imported when one loads);
- `token`: `explain_token`, what one token borrows, as an `ExplainReport`;
- `head_statistics`: `head_stats`, what each head does, as `HeadStats`; `probe`: the induction
  probe; `training`: heads forming while a GPT trains (heads.jsonl);
- `attention_flow`: attention rollout and flow, `TokenSources` for one token;
- `page_payload`: a view page's numbers for one capture, as a `PagePayload`.
"""

from attnlab.explain.attention_flow import flow, rollout
from attnlab.explain.head_statistics import head_stats
from attnlab.explain.lesson_sections import SECTIONS, build_lesson

__all__ = ["SECTIONS", "build_lesson", "flow", "head_stats", "rollout"]


def __getattr__(name: str):  # `import attnlab` then attnlab.explain.training: import on first use
    import importlib
    import importlib.util

    if not name.startswith("_") and importlib.util.find_spec(f"attnlab.explain.{name}"):
        return importlib.import_module(f"attnlab.explain.{name}")
    raise AttributeError(f"module 'attnlab.explain' has no attribute {name!r}")
