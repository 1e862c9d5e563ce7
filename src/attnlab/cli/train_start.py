"""`attnlab train`'s Trainer from the command line: the run directory checked (a new run or
--resume), then the preset with the settings given started, or the checkpoint resumed; for one
process, rank 0 of a launch, or each worker."""

from __future__ import annotations

import os
from pathlib import Path

from attnlab.cli.options import preset_settings


def check_out(args, out: Path) -> None:
    """attnlab.json alone decides: a damaged checkpoint is reported by the loader, not
    overwritten."""
    from attnlab.errors import AttnlabError
    from attnlab.models.checkpoint import META_FILE, check_writable

    if args.resume:
        if not os.path.lexists(out / META_FILE):  # a directory or FIFO there: the loader says so
            raise AttnlabError(f"--resume: no checkpoint in {str(out)!r} to resume")
        if args.seed is not None:
            raise AttnlabError("--seed: a resumed run keeps the seed it started with")
    elif os.path.lexists(out / META_FILE):
        raise AttnlabError(f"--out: {str(out)!r} already holds a checkpoint; pass --resume to "
                           "continue it or choose another --out")
    check_writable(out, "--out")


def make_trainer(args, out: Path, parallel):
    from attnlab.models import Trainer

    if parallel is None or parallel.is_main:
        check_out(args, out)
    from attnlab.models.config import TrainConfig
    from attnlab.models.schedule import with_schedule

    progress = not args.quiet
    schedule = {"lr": args.lr, "min_lr": args.min_lr, "warmup_steps": args.warmup_steps}
    if args.resume:
        return Trainer.resume(out, progress=progress, max_steps=args.max_steps, parallel=parallel,
                              dropout=args.dropout, **schedule)
    overrides = preset_settings(args, "--max-steps", "--seed", "--batch-size", "--eval-interval")
    if any(v is not None for v in schedule.values()):
        tcfg = with_schedule(TrainConfig.from_name(args.preset), **schedule)
        overrides.update(lr=tcfg.lr, min_lr=tcfg.min_lr, warmup_steps=tcfg.warmup_steps)
    model = {} if args.dropout is None else {"dropout": args.dropout}
    return Trainer.start(args.preset, out=out, progress=progress, parallel=parallel,
                         model_overrides=model, **overrides)
