"""A trained run kept in a cache: train a preset once, read it from then on (the docs' generated
numbers and the examples use it so a build or a notebook trains only the first time).

    >>> path = cached_run("tiny", max_steps=600, repeat_prob=0.5)   # minutes the first time
    >>> model, tok = load_checkpoint(path)                          # doctest: +SKIP

The run lives in ATTNLAB_RUNS (default ~/.cache/attnlab/runs) under a name made of the preset,
the steps and the overrides; an interrupted run resumes where its last checkpoint stopped.
Training is deterministic for a seed on one thread, so every cache holds the same weights.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from attnlab.models.checkpoint import is_checkpoint
from attnlab.models.checkpoint_checks import parse_doc
from attnlab.models.trainer import Trainer


def runs_dir() -> Path:
    return Path(os.environ.get("ATTNLAB_RUNS") or Path.home() / ".cache" / "attnlab" / "runs")


def cached_run(preset: str, *, max_steps: int, **overrides) -> Path:
    """The checkpoint directory of `preset` trained to `max_steps` with the TrainConfig
    `overrides`, training (or finishing) it first when the cache has no such run."""
    key = json.dumps({"preset": preset, "max_steps": max_steps, **overrides}, sort_keys=True)
    name = f"{preset}-{max_steps}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    out = runs_dir() / name
    if is_checkpoint(out):
        if int(parse_doc(out)["state"]["step"]) >= max_steps:
            return out
        trainer = Trainer.resume(out)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        trainer = Trainer.start(preset, out=out, max_steps=max_steps, **overrides)
    trainer.run()
    return out
