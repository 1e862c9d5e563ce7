"""What `attnlab train` prints about a run: the header (preset, parameters, corpus, layout), a
sample of the model's text at each evaluation, and the summary with the `attnlab generate` command
that continues from it."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def header(trainer, out: Path, parallel=None) -> None:
    """The run's first line, on stderr: preset, parameters, corpus, processes, steps, --out."""
    cfg = trainer.config
    layout = "" if parallel is None else (f", {parallel.world} processes (data parallel "
                                          f"{parallel.dp} × context parallel {parallel.cp})")
    print(f"attnlab train: preset {trainer.model.config.name}, "
          f"{trainer.model.num_params():,} parameters, corpus {cfg.corpus!r} "
          f"({len(trainer.data.train):,} train / {len(trainer.data.val):,} val tokens)"
          f"{_repeats(cfg)}{layout}, steps {trainer.step} -> {cfg.max_steps}, checkpoints in "
          f"{out}", file=sys.stderr)


def _repeats(cfg) -> str:
    """The header's word on repeated-text windows: their training loss is not the corpus's."""
    if not cfg.repeat_prob:
        return ""
    return (f", {cfg.repeat_prob:.0%} of training windows repeated text (repeat_prob "
            f"{cfg.repeat_prob:g}: train loss is not plain-corpus loss; val loss is)")


def summary(trainer, out: Path, peak_mib: float | None = None) -> None:
    """The run's last lines: losses, speed, peak memory, and the generate command for --out."""
    val = trainer.val_history[-1]["val_loss"] if trainer.val_history else float("nan")
    tps = trainer.tokens_seen / max(trainer.elapsed_s, 1e-9)  # every process's tokens
    peak = "" if peak_mib is None else f", peak memory {peak_mib:,.0f} MiB/process"
    print(f"step {trainer.step}: train loss {trainer.history[-1]['loss']:.4f}, val loss "
          f"{val:.4f}, {tps:,.0f} tokens/s, {trainer.elapsed_s:.1f} s training{peak}; saved "
          f"{out}")
    prompt = sample_prompt(trainer)
    print(f"next: attnlab generate --model {shlex.quote(str(out))} --prompt "
          f"{shlex.quote(prompt)}")


SAMPLE_TOKENS = 80


def sample_prompt(trainer) -> str:
    """A prompt every corpus can encode: the start of the validation text's second line (up to
    12 characters, whole words), else its first 12 tokens."""
    head = trainer.tokenizer.decode([int(i) for i in trainer.data.val[:400]])
    lines = [x.strip() for x in head.split("\n")[1:-1] if x.strip()]
    if lines:
        words, line = lines[0].split(), ""
        for w in words:
            if line and len(line) + 1 + len(w) > 12:
                break
            line = f"{line} {w}".strip()
        return line
    return trainer.tokenizer.decode([int(i) for i in trainer.data.val[:12]])


def print_sample(trainer) -> None:
    """At an evaluation: what the model writes now, from the validation text's first tokens
    (seed 0; the training's own random state is untouched)."""
    from attnlab.models import generate

    prompt = sample_prompt(trainer)
    ids = generate(trainer.model, trainer.tokenizer.encode(prompt), SAMPLE_TOKENS,
                   temperature=0.8, seed=0)
    text = trainer.tokenizer.decode(ids[len(trainer.tokenizer.encode(prompt)):])
    line = (f"step {trainer.step}: val loss {trainer.val_history[-1]['val_loss']:.3f}; sample: "
            f"{prompt!r} -> {text!r}")
    try:
        from tqdm import tqdm

        tqdm.write(line, file=sys.stdout)  # above the progress bar, not through it
    except ImportError:
        print(line, flush=True)


def peak_mib() -> float | None:
    """This process's peak resident memory (Linux, macOS), None where unknown."""
    try:
        import resource
    except ImportError:
        return None
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / (1 << 20) if sys.platform == "darwin" else kib / 1024
