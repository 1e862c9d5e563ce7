"""`attnlab train`: train a small GPT on the bundled public-domain corpus, on CPU."""

from __future__ import annotations

import sys
from pathlib import Path


def add_parser(sub):
    p = sub.add_parser("train", help="train a small GPT on the bundled Shakespeare corpus",
                       description=__doc__)
    p.add_argument("--preset", default="tiny",
                   help="model and training preset: tiny (default), tiny-gqa, small")
    p.add_argument("--max-steps", type=int, default=None, metavar="N",
                   help="train until step N (default: the preset's)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="checkpoint directory (default: runs/PRESET)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run checkpointed in --out")
    p.add_argument("--seed", type=int, default=None, help="seed for weights and batch order")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch intra-op threads (default: torch's choice; on a busy machine 1 "
                   "can be much faster)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def run(args) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.models import PRESETS, Trainer
    from attnlab.models.checkpoint import META_FILE, check_writable

    if args.preset not in PRESETS:
        raise AttnlabError(f"--preset: unknown {args.preset!r}; expected one of {sorted(PRESETS)}")
    if args.max_steps is not None and args.max_steps < 1:
        raise AttnlabError(f"--max-steps: expected a positive number of steps, got "
                           f"{args.max_steps}")
    if args.threads is not None:
        if args.threads < 1:
            raise AttnlabError(f"--threads: expected a positive number, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    out = Path(args.out or Path("runs") / args.preset)
    # attnlab.json alone decides: a damaged checkpoint is reported by the loader, not overwritten
    if args.resume:
        if not (out / META_FILE).is_file():
            raise AttnlabError(f"--resume: no checkpoint in {str(out)!r} to resume")
        if args.seed is not None:
            raise AttnlabError("--seed: a resumed run keeps the seed it started with")
        check_writable(out, "--out")
        trainer = Trainer.resume(out, progress=not args.quiet, max_steps=args.max_steps)
    else:
        if (out / META_FILE).exists():
            raise AttnlabError(f"--out: {str(out)!r} already holds a checkpoint; pass --resume to "
                               "continue it or choose another --out")
        check_writable(out, "--out")
        overrides = {k: v for k, v in (("max_steps", args.max_steps), ("seed", args.seed))
                     if v is not None}
        trainer = Trainer.start(args.preset, out=out, progress=not args.quiet, **overrides)
    cfg = trainer.config
    print(f"attnlab train: preset {trainer.model.config.name}, "
          f"{trainer.model.num_params():,} parameters, corpus {cfg.corpus!r} "
          f"({len(trainer.data.train):,} train / {len(trainer.data.val):,} val tokens), "
          f"steps {trainer.step} -> {cfg.max_steps}, checkpoints in {out}", file=sys.stderr)
    try:
        trainer.run(handle_interrupt=True)
    except KeyboardInterrupt:
        print(f"attnlab train: interrupted at step {trainer.step}; saved to {out}; continue with "
              f"attnlab train --out {out} --resume", file=sys.stderr)
        return 130
    val = trainer.val_history[-1]["val_loss"] if trainer.val_history else float("nan")
    tps = trainer.tokens_seen / max(trainer.elapsed_s, 1e-9)
    print(f"step {trainer.step}: train loss {trainer.history[-1]['loss']:.4f}, val loss "
          f"{val:.4f}, {tps:,.0f} tokens/s, {trainer.elapsed_s:.1f} s training; saved {out}")
    return 0
