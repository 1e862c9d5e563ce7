"""`attnlab train`: train a small GPT on the bundled public-domain corpus, on CPU; across N local
processes with `--nproc N [--dp D] [--cp C]`, or as one worker of a torchrun job."""

from __future__ import annotations

import sys
from pathlib import Path

from attnlab.cli.options import add_preset_setting, add_threads, command
from attnlab.cli.train_processes import launch_workers, run_worker
from attnlab.cli.train_report import header, peak_mib, print_sample, summary
from attnlab.cli.train_start import check_out, make_trainer

#: the most threads, and local processes, one `attnlab train` starts
MAX_LOCAL = 1024


def add_parser(sub):
    p = command(sub, "train", __doc__, "train a small GPT on the bundled Shakespeare corpus")
    p.add_argument("--preset", default="tiny",
                   help="model and training preset: tiny (default), tiny-gqa, small, induction")
    add_preset_setting(p, "--max-steps", "N", "train until step N")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="checkpoint directory (default: runs/PRESET)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run checkpointed in --out (under any --dp/--cp)")
    add_preset_setting(p, "--seed", None, "seed for weights and batch order")
    add_preset_setting(p, "--batch-size", "B", "sequences per step, all processes together")
    add_preset_setting(p, "--eval-interval", "N", "validate and save every N steps")
    add_preset_setting(p, "--lr", "LR", "peak learning rate after warm-up (default: the preset's; "
                       "with --resume, the run's); the floor --min-lr moves with it unless given")
    add_preset_setting(p, "--min-lr", "LR", "learning rate at the end of the cosine decay (at "
                       "most --lr; default: the preset's, moved with --lr)")
    add_preset_setting(p, "--warmup-steps", "N", "steps of linear warm-up from 0 to --lr (0: "
                       "none; default: the preset's)")
    add_preset_setting(p, "--dropout", "P", "dropout probability of the model, 0 <= P < 1")
    add_threads(p, help="torch intra-op threads per process (default 1: on a machine shared "
                "with other jobs more threads can wait on each other and train many times "
                "slower; give the number of idle cores to use them)")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="train on N local processes (N = D × C) through torch.distributed.run "
                   "(default: D × C, 1 process)")
    p.add_argument("--dp", type=int, default=None, metavar="D",
                   help="data-parallel replicas: each trains on its rows of every batch "
                   "(default: N / C)")
    p.add_argument("--cp", type=int, default=1, metavar="C",
                   help="context-parallel ranks per replica: each holds part of every sequence "
                   "(default: 1)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="seconds a process waits for the others before the run stops with an "
                   "error, and after Ctrl-C for the workers to finish the step and save "
                   "(default: 300)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--track-heads", action="store_true",
                   help="at every evaluation, write head statistics on a repeated-random probe "
                   "to OUT/heads.jsonl (one process; see attnlab track-heads)")
    return p


def _need_train_extra() -> None:
    """Refuse at once, naming the extra, when what training needs is not installed."""
    import importlib.util

    from attnlab.errors import AttnlabError

    missing = [m for m in ("safetensors", "tqdm") if importlib.util.find_spec(m) is None]
    if missing:
        raise AttnlabError(f"attnlab train needs the train extra ({', '.join(missing)} missing): "
                           "pip install 'attnlab[train]'")


def run(args) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.models import PRESETS
    from attnlab.models.parallel import launched

    _need_train_extra()
    if args.preset not in PRESETS:
        raise AttnlabError(f"--preset: unknown {args.preset!r}; expected one of {sorted(PRESETS)}")
    for flag, v in (("--max-steps", args.max_steps), ("--batch-size", args.batch_size),
                    ("--eval-interval", args.eval_interval), ("--threads", args.threads),
                    ("--nproc", args.nproc), ("--dp", args.dp), ("--cp", args.cp)):
        if v is not None and v < 1:
            raise AttnlabError(f"{flag}: expected a positive number, got {v}")
    for flag, v in (("--threads", args.threads), ("--nproc", args.nproc)):
        if v is not None and v > MAX_LOCAL:  # threads and processes of this one machine
            raise AttnlabError(f"{flag}: {v} is beyond the limit of {MAX_LOCAL}")
    _check_schedule(args)
    out = Path(args.out or Path("runs") / args.preset)
    if launched():
        return run_worker(args, out)
    nproc = _nproc(args)
    if nproc > 1 and args.track_heads:
        raise AttnlabError("--track-heads: one process only; leave out --nproc/--dp/--cp")
    if nproc > 1:
        check_out(args, out)
        return launch_workers(args, out, nproc)
    if args.cp > 1:
        raise AttnlabError(f"--cp: {args.cp} context-parallel ranks need --nproc {args.cp} or more")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    trainer = make_trainer(args, out, None)
    with trainer.locked():  # refused before the header when another run writes to --out
        return _train_here(args, trainer, out)


def _train_here(args, trainer, out: Path) -> int:
    header(trainer, out)
    if not args.quiet:
        trainer.on_eval.append(print_sample)
    if args.track_heads:
        from attnlab.explain.training import track_heads

        track_heads(trainer, every=trainer.config.eval_interval)
        summary(trainer, out, peak_mib())
        return 0
    try:
        trainer.run(handle_interrupt=True)
    except KeyboardInterrupt:
        print(f"attnlab train: interrupted at step {trainer.step}; saved to {out}; continue with "
              f"attnlab train --out {out} --resume", file=sys.stderr)
        return 130
    summary(trainer, out, peak_mib())
    return 0


def _check_schedule(args) -> None:
    import math

    from attnlab.errors import AttnlabError

    for flag, v in (("--lr", args.lr), ("--min-lr", args.min_lr)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise AttnlabError(f"{flag}: expected a finite number > 0, got {v}")
    if args.lr is not None and args.min_lr is not None and args.min_lr > args.lr:
        raise AttnlabError(f"--min-lr: expected at most --lr {args.lr:g}, got {args.min_lr:g}")
    if args.warmup_steps is not None and args.warmup_steps < 0:
        raise AttnlabError(f"--warmup-steps: expected 0 or more, got {args.warmup_steps}")
    if args.dropout is not None and not 0 <= args.dropout < 1:
        raise AttnlabError(f"--dropout: expected a probability in [0, 1), got {args.dropout}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):  # once, before any worker starts
        raise AttnlabError(f"--timeout: expected a positive number of seconds, got "
                           f"{args.timeout}")


def _nproc(args) -> int:
    from attnlab.errors import AttnlabError

    if args.nproc is None:
        return (args.dp or 1) * args.cp
    dp = args.nproc // args.cp if args.dp is None else args.dp
    if dp * args.cp != args.nproc:
        raise AttnlabError(f"--nproc, --dp, --cp: N = D × C expected, got N = {args.nproc}, "
                           f"D = {args.dp if args.dp is not None else 'N / C'}, C = {args.cp}")
    return args.nproc
