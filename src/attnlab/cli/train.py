"""`attnlab train`: train a small GPT on the bundled public-domain corpus, on CPU; across N local
processes with `--nproc N [--dp D] [--cp C]`, or as one worker of a torchrun job."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from attnlab.cli.options import add_preset_setting, add_threads, preset_settings

#: the most threads, and local processes, one `attnlab train` starts
MAX_LOCAL = 1024


def add_parser(sub):
    p = sub.add_parser("train", help="train a small GPT on the bundled Shakespeare corpus",
                       description=__doc__)
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
        return _worker(args, out)
    nproc = _nproc(args)
    if nproc > 1 and args.track_heads:
        raise AttnlabError("--track-heads: one process only; leave out --nproc/--dp/--cp")
    if nproc > 1:
        _check_out(args, out)
        return _launch(args, out, nproc)
    if args.cp > 1:
        raise AttnlabError(f"--cp: {args.cp} context-parallel ranks need --nproc {args.cp} or more")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    trainer = _trainer(args, out, None)
    with trainer.locked():  # refused before the header when another run writes to --out
        return _train_here(args, trainer, out)


def _train_here(args, trainer, out: Path) -> int:
    _header(trainer, out)
    if not args.quiet:
        trainer.on_eval.append(_print_sample)
    if args.track_heads:
        from attnlab.explain.training import track_heads

        track_heads(trainer, every=trainer.config.eval_interval)
        _summary(trainer, out, _peak_mib())
        return 0
    try:
        trainer.run(handle_interrupt=True)
    except KeyboardInterrupt:
        print(f"attnlab train: interrupted at step {trainer.step}; saved to {out}; continue with "
              f"attnlab train --out {out} --resume", file=sys.stderr)
        return 130
    _summary(trainer, out, _peak_mib())
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


def _check_out(args, out: Path) -> None:
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


def _trainer(args, out: Path, parallel):
    from attnlab.models import Trainer

    if parallel is None or parallel.is_main:
        _check_out(args, out)
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


def _header(trainer, out: Path, parallel=None) -> None:
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


def _summary(trainer, out: Path, peak_mib: float | None = None) -> None:
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


def _print_sample(trainer) -> None:
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


def _peak_mib() -> float | None:
    """This process's peak resident memory (Linux, macOS), None where unknown."""
    try:
        import resource
    except ImportError:
        return None
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / (1 << 20) if sys.platform == "darwin" else kib / 1024


def _worker_args(args, out: Path, nproc: int) -> list[str]:
    """The `attnlab train` arguments of each launched worker (`--nproc` left out)."""
    argv = ["train", "--preset", args.preset, "--out", str(out.resolve()),
            "--dp", str(nproc // args.cp), "--cp", str(args.cp), "--timeout", str(args.timeout),
            "--threads", str(args.threads or 1)]
    for setting, v in preset_settings(args).items():  # every one given, in their order
        argv += ["--" + setting.replace("_", "-"), repr(v)]
    return argv + ["--resume"] * args.resume + ["--quiet"] * args.quiet


def _launch(args, out: Path, nproc: int) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.models.launch import INTERRUPTED, launch
    from attnlab.models.run_lock import RunLock

    # the launcher holds the directory's lock for its workers: rank 0 writes under it, and a
    # second run on the directory is refused while this one lives
    with RunLock(out, what="--out"):
        try:  # after Ctrl-C the workers finish the step and save: give them --timeout for it
            launch(_worker_args(args, out, nproc), nproc, threads=args.threads or 1,
                   grace_s=args.timeout)
        except AttnlabError as e:
            raise AttnlabError(f"{e}. {_resume_hint(out, nproc, args.cp)}") from None
        except KeyboardInterrupt:
            print(f"attnlab train: interrupted. {_resume_hint(out, nproc, args.cp)}",
                  file=sys.stderr)
            return INTERRUPTED
    return 0


def _resume_hint(out: Path, nproc: int, cp: int) -> str:
    from attnlab.errors import AttnlabError
    from attnlab.models.checkpoint_checks import parse_doc
    from attnlab.models.launch import LOCAL_LAUNCH_ENV
    from attnlab.models.parallel import launched

    try:  # the checked reader: it neither blocks on a FIFO nor recurses without bound
        step = parse_doc(out)["state"]["step"]
    except AttnlabError:
        return f"No checkpoint was saved to {out}"
    if launched() and LOCAL_LAUNCH_ENV not in os.environ:  # a worker of the user's torchrun
        return (f"{out} keeps the checkpoint of step {step}; continue with the same torchrun "
                f"command and: attnlab train --out {out} --resume")
    more = f" --nproc {nproc}" + (f" --cp {cp}" if cp > 1 else "")
    return (f"{out} keeps the checkpoint of step {step}; continue with: attnlab train --out "
            f"{out} --resume{more}")


def _lost_peer(e: RuntimeError) -> bool:
    """torch.distributed's ways of saying that a peer died or stopped answering."""
    import re

    import torch.distributed as dist

    return isinstance(e, getattr(dist, "DistError", ())) or bool(re.search(
        r"gloo|nccl|connection|timed out|timeout|closed by peer|broken pipe", str(e), re.I))


def _first_words(e: Exception) -> str:
    """The gist of a torch.distributed error: its first sentence, without the source location."""
    import re

    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)  # "[.../gloo/transport/tcp/pair.cc:537] "
    return text.split(". ")[0].rstrip(".")


def _worker(args, out: Path) -> int:
    """One rank of a torchrun / --nproc job: join the group, train, leave."""
    from attnlab.errors import AttnlabError
    from attnlab.models.launch import die_with_launcher
    from attnlab.models.parallel import setup

    die_with_launcher()  # our launcher killed (kill -9 too): this worker stops at once

    world = int(os.environ["WORLD_SIZE"])
    if getattr(args, "track_heads", False):
        raise AttnlabError("--track-heads: one process only; torchrun started "
                           f"{world} processes")
    if args.nproc is not None and args.nproc != world:
        raise AttnlabError(f"--nproc: {args.nproc}, but torchrun started {world} processes")
    import gc
    import signal

    import torch

    from attnlab.models.launch import INTERRUPTED, LOCAL_LAUNCH_ENV

    trainer = None
    interrupted = False

    def on_ctrl_c(signum, frame):  # every rank stops after the same step; rank 0 saves it
        nonlocal interrupted
        interrupted = True
        if trainer is not None:
            trainer.request_stop()

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    torch.set_num_threads(args.threads or 1)
    try:
        par = setup(args.dp, args.cp, timeout_s=args.timeout)
    except BaseException:
        signal.signal(signal.SIGINT, previous)
        raise
    try:
        trainer = _trainer(args, out, par)
        if interrupted:
            trainer.request_stop()
        if par.is_main:
            _header(trainer, out, par)
        trainer.run()
        peak = _peak_mib()
        peak = None if peak is None else par.max(peak)
        if par.is_main:
            _summary(trainer, out, peak)
        return 0
    except KeyboardInterrupt:  # every rank stopped after the same step and rank 0 saved it
        if par.is_main and LOCAL_LAUNCH_ENV not in os.environ:  # torchrun: no launcher of ours
            print(f"attnlab train: interrupted. {_resume_hint(out, par.world, par.cp)}",
                  file=sys.stderr)
        return INTERRUPTED
    except AttnlabError as e:
        if par.is_main or not getattr(e, "every_rank", False):
            raise AttnlabError(f"rank {par.rank}: {e}") from None
        return 2  # the same error on every rank: rank 0 says it
    except RuntimeError as e:
        if not _lost_peer(e):
            raise
        step = "" if trainer is None else f" at step {trainer.step}"
        first = _first_words(e)
        raise AttnlabError(f"rank {par.rank}: lost contact with the other processes{step} "
                           f"({first}); the run stopped. "
                           f"{_resume_hint(out, par.world, par.cp)}") from None
    finally:
        # DistributedDataParallel holds the process group: let it go while the interpreter is
        # whole, so the group is torn down here and not during exit
        trainer = None
        gc.collect()
        par.close()
        signal.signal(signal.SIGINT, previous)
