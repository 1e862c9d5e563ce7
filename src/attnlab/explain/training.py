"""Heads forming during training: `track_heads` trains an attnlab GPT and evaluates `head_stats` on
a fixed repeated-random probe every `every` steps, one JSON line per evaluation.

    >>> from attnlab.models import Trainer
    >>> trainer = Trainer.start("induction", out="runs/ind")                  # doctest: +SKIP
    >>> track_heads(trainer, every=25)      # runs/ind/heads.jsonl            # doctest: +SKIP

Each line: {"step", "loss" (mean training loss since the previous line; null at step 0),
"val_loss" (the trainer's last validation, or null), "val_step" (the step it was taken at),
"first_copy_loss" and "second_copy_loss" (the model's loss on the probe's two copies,
`copy_losses`), "stats": {name: [[value per head] per layer]}, "labels"}, statistics as
`HeadStats.to_json`; lines written before val_step and the copy losses existed lack those keys.
The probe is the same at every step: N seeded random token ids, then the same N again (Olsson et
al. 2022), so `induction` is the induction score, and the second copy's loss falling below the
first's is the in-context learning those heads bring (the training loss, mixing plain and repeated
windows, shows it only blurred). The ids are drawn from the characters that make up most of the
training text (`frequent_ids`): a character seen a handful of times (a digit, "&") has an
embedding too little trained for any head to match it, and would hide a working induction head.
It drives the trainer through its public `run(stop_after=...)`, which also saves the checkpoint
each time.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab import models
from attnlab.errors import AttnlabError
from attnlab.explain.head_statistics import head_stats
from attnlab.explain.probe import frequent_ids, random_tokens

HEADS_FILE = "heads.jsonl"


def probe_ids(vocab_size: int, n: int, seed: int = 0, *, pool=None) -> list[int]:
    """N seeded random ids from `pool` (default: all of 0..vocab_size-1), then the same N again."""
    seq = random_tokens(list(range(vocab_size)) if pool is None else list(pool), n, seed)
    return seq + seq


def copy_losses(model, ids: list[int]) -> tuple[float, float]:
    """The mean next-token loss (nats) of `model` (a GPT) on each copy of a probe `ids` (N tokens,
    then the same N): over tokens 2..N of the first copy and tokens 2..N of the second, each
    predicted from all the tokens before it. A copy's first token is left out of both: nothing
    before it says what it is. On the second copy every token came once before, followed by the
    one to predict, so an induction head makes it cheap while the first stays random."""
    n = len(ids) // 2
    if n < 2 or list(ids[:n]) != list(ids[n:]):
        raise AttnlabError(f"ids: expected N >= 2 tokens then the same N again, got {len(ids)} "
                           "tokens")
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits, _ = model(torch.tensor([list(ids[:-1])]))  # (1, 2N - 1, V)
    model.train(was_training)
    # position t predicts ids[t + 1]: the first copy's tokens 2..N at t = 0..N-2, the second's
    # at t = N..2N-2 (t = N-1 predicts the second copy's first token)
    nll = F.cross_entropy(logits[0].float(), torch.tensor(list(ids[1:])), reduction="none")
    return float(nll[:n - 1].mean()), float(nll[n:].mean())


def track_heads(trainer, *, every: int = 25, probe_n: int = 32, seed: int = 0,
                path=None) -> Path:
    """Train `trainer` to its max_steps, writing head statistics on the probe every `every` steps
    (and at the start) to `path` (default: the run directory's heads.jsonl). Returns the path."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise AttnlabError(f"every: expected a positive number of steps, got {every!r}")
    if isinstance(probe_n, bool) or not isinstance(probe_n, int) or probe_n < 2:
        raise AttnlabError(f"probe_n: expected 2 or more random tokens, got {probe_n!r}")
    model = trainer.model
    if 2 * probe_n > model.config.block_size:
        raise AttnlabError(f"probe_n: 2·{probe_n} tokens exceed the block size "
                           f"{model.config.block_size}")
    out = Path(path) if path is not None else Path(trainer.out) / HEADS_FILE
    pool = frequent_ids(trainer.data.train, at_least=probe_n)
    ids = probe_ids(model.config.vocab_size, probe_n, seed, pool=pool)
    tokens = [str(i) for i in ids]

    def line(loss):
        att = models.capture_attention(model, ids)
        att.tokens = tokens
        stats = head_stats(att, special=())
        doc = stats.to_json()
        val = trainer.val_history[-1] if trainer.val_history else {"val_loss": None, "step": None}
        first, second = copy_losses(model, ids)
        return {"step": trainer.step, "loss": loss, "val_loss": val["val_loss"],
                "val_step": val["step"], "first_copy_loss": first, "second_copy_loss": second,
                "stats": doc["stats"], "labels": doc["labels"]}

    with out.open("a" if trainer.step > 0 else "w", encoding="utf-8") as f:
        if trainer.step == 0:
            write_line(f, line(None))
        while trainer.step < trainer.config.max_steps:
            before = len(trainer.history)
            trainer.run(stop_after=every)
            losses = [h["loss"] for h in trainer.history[before:]]
            write_line(f, line(sum(losses) / len(losses)))
    return out


def write_line(f, doc: dict) -> None:
    """Append `doc` as one whole JSON line and put it on disk (flush + fsync) before training
    goes on: a kill leaves at most the line being written torn, which `read_heads` skips."""
    f.write(json.dumps(doc) + "\n")
    f.flush()
    os.fsync(f.fileno())


def read_heads(run) -> list[dict]:
    """The lines of a run's heads.jsonl (a run directory or the file itself).

    A torn last line (the run was killed while writing it) is skipped with a warning; a damaged
    line before the last is an error naming its number."""
    p = Path(run)
    p = p / HEADS_FILE if p.is_dir() else p
    if not p.is_file():
        raise AttnlabError(f"run: no {HEADS_FILE} in {run} (train with head tracking first)")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise AttnlabError(f"run: {p} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    rows = text.split("\n")
    numbered = [(k + 1, row) for k, row in enumerate(rows) if row.strip()]
    out = []
    for k, (number, row) in enumerate(numbered):
        try:
            doc = json.loads(row)
            why = None if isinstance(doc, dict) else f"a JSON {type(doc).__name__}"
        except ValueError as e:
            why = str(e)
        if why is not None:
            if k == len(numbered) - 1:
                warnings.warn(f"{p}: line {number} is torn (the run stopped while writing it); "
                              "skipped", stacklevel=2)
                break
            raise AttnlabError(f"run: {p} line {number} is not a JSON object ({why})")
        out.append(doc)
    return out


def induction_summary(lines: list[dict], *, threshold: float = 0.4) -> dict:
    """What a run's heads.jsonl lines say about induction heads: {"max", "max_step", "head"
    ((layer, head) of the largest score), "formed_step" (the first step where some head's score
    reaches `threshold`, the "induction" label's, or None), "formed_loss" (the training loss
    of that line), "chance" (the largest score at step 0, or None)}."""
    best = (float("-inf"), None, None)
    formed = None
    chance = None
    for d in lines:
        scores = [(v, (l, h)) for l, row in enumerate(d["stats"]["induction"])
                  for h, v in enumerate(row) if v is not None]
        if not scores:
            continue
        top, where = max(scores)
        if d["step"] == 0:
            chance = top
        if top > best[0]:
            best = (top, d["step"], where)
        if formed is None and top >= threshold:
            formed = d
    if best[1] is None:
        raise AttnlabError("lines: no induction score in any line")
    return {"max": best[0], "max_step": best[1], "head": best[2],
            "formed_step": None if formed is None else formed["step"],
            "formed_loss": None if formed is None else formed["loss"], "chance": chance}
