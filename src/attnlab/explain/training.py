"""Heads forming during training: `track_heads` trains an attnlab GPT and evaluates `head_stats` on
a fixed repeated-random probe every `every` steps, one JSON line per evaluation.

    >>> from attnlab.models import Trainer
    >>> trainer = Trainer.start("tiny", out="runs/ind", **INDUCTION["train"],
    ...                         model_overrides=INDUCTION["model"])          # doctest: +SKIP
    >>> track_heads(trainer, every=25)      # runs/ind/heads.jsonl            # doctest: +SKIP

Each line: {"step", "loss" (mean training loss since the previous line; null at step 0), "val_loss"
(the trainer's last validation, or null), "stats": {name: [[value per head] per layer]},
"labels"}, statistics as `HeadStats.to_json`. The probe is the same at every step: N seeded
random token ids, then the same N again (Olsson et al. 2022), so `induction` is the induction
score. It drives the trainer through its public `run(stop_after=...)`, which also saves the
checkpoint each time.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnlab.errors import AttnlabError

HEADS_FILE = "heads.jsonl"

#: the `induction` setting: 2 layers, small, on the bundled corpus (overrides of "tiny")
INDUCTION = {
    "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 128},
    "train": {"max_steps": 1200, "batch_size": 16, "lr": 3e-3, "min_lr": 3e-4,
              "warmup_steps": 30, "eval_interval": 200},
}


def probe_ids(vocab_size: int, n: int, seed: int = 0) -> list[int]:
    """N seeded random ids in 0..vocab_size-1, then the same N again."""
    from attnlab.explain.probe import random_tokens

    seq = random_tokens(list(range(vocab_size)), n, seed)
    return seq + seq


def track_heads(trainer, *, every: int = 25, probe_n: int = 32, seed: int = 0,
                path=None) -> Path:
    """Train `trainer` to its max_steps, writing head statistics on the probe every `every` steps
    (and at the start) to `path` (default: the run directory's heads.jsonl). Returns the path."""
    from attnlab.explain.heads import head_stats
    from attnlab.models import capture_attention

    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise AttnlabError(f"every: expected a positive number of steps, got {every!r}")
    model = trainer.model
    if 2 * probe_n > model.config.block_size:
        raise AttnlabError(f"probe_n: 2·{probe_n} tokens exceed the block size "
                           f"{model.config.block_size}")
    out = Path(path) if path is not None else Path(trainer.out) / HEADS_FILE
    ids = probe_ids(model.config.vocab_size, probe_n, seed)
    tokens = [str(i) for i in ids]

    def line(loss):
        att = capture_attention(model, ids)
        att.tokens = tokens
        stats = head_stats(att, special=())
        doc = stats.to_json()
        val = trainer.val_history[-1]["val_loss"] if trainer.val_history else None
        return {"step": trainer.step, "loss": loss, "val_loss": val, "stats": doc["stats"],
                "labels": doc["labels"]}

    with out.open("a" if trainer.step > 0 else "w", encoding="utf-8") as f:
        if trainer.step == 0:
            f.write(json.dumps(line(None)) + "\n")
        while trainer.step < trainer.config.max_steps:
            before = len(trainer.history)
            trainer.run(stop_after=every)
            losses = [h["loss"] for h in trainer.history[before:]]
            f.write(json.dumps(line(sum(losses) / len(losses))) + "\n")
            f.flush()
    return out


def read_heads(run) -> list[dict]:
    """The lines of a run's heads.jsonl (a run directory or the file itself)."""
    p = Path(run)
    p = p / HEADS_FILE if p.is_dir() else p
    if not p.is_file():
        raise AttnlabError(f"run: no {HEADS_FILE} in {run} (train with head tracking first)")
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line]
