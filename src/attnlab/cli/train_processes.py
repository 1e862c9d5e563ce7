"""`attnlab train` across processes: the launcher of `--nproc N` (each worker's arguments, the
directory's lock, Ctrl-C), one worker of it or of the user's torchrun, and what a run that stopped
says (where its checkpoint is, how to continue, a lost peer in one line)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from attnlab.cli.options import preset_settings
from attnlab.cli.train_report import header, peak_mib, summary
from attnlab.cli.train_start import make_trainer


def worker_argv(args, out: Path, nproc: int) -> list[str]:
    """The `attnlab train` arguments of each launched worker (`--nproc` left out)."""
    argv = ["train", "--preset", args.preset, "--out", str(out.resolve()),
            "--dp", str(nproc // args.cp), "--cp", str(args.cp), "--timeout", str(args.timeout),
            "--threads", str(args.threads or 1)]
    for setting, v in preset_settings(args).items():  # every one given, in their order
        argv += ["--" + setting.replace("_", "-"), repr(v)]
    return argv + ["--resume"] * args.resume + ["--quiet"] * args.quiet


def launch_workers(args, out: Path, nproc: int) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.models.launch import INTERRUPTED, launch
    from attnlab.models.run_lock import RunLock

    # the launcher holds the directory's lock for its workers: rank 0 writes under it, and a
    # second run on the directory is refused while this one lives
    with RunLock(out, what="--out"):
        try:  # after Ctrl-C the workers finish the step and save: give them --timeout for it
            launch(worker_argv(args, out, nproc), nproc, threads=args.threads or 1,
                   grace_s=args.timeout)
        except AttnlabError as e:
            raise AttnlabError(f"{e}. {resume_hint(out, nproc, args.cp)}") from None
        except KeyboardInterrupt:
            print(f"attnlab train: interrupted. {resume_hint(out, nproc, args.cp)}",
                  file=sys.stderr)
            return INTERRUPTED
    return 0


def resume_hint(out: Path, nproc: int, cp: int) -> str:
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


def run_worker(args, out: Path) -> int:
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
        trainer = make_trainer(args, out, par)
        if interrupted:
            trainer.request_stop()
        if par.is_main:
            header(trainer, out, par)
        trainer.run()
        peak = peak_mib()
        peak = None if peak is None else par.max(peak)
        if par.is_main:
            summary(trainer, out, peak)
        return 0
    except KeyboardInterrupt:  # every rank stopped after the same step and rank 0 saved it
        if par.is_main and LOCAL_LAUNCH_ENV not in os.environ:  # torchrun: no launcher of ours
            print(f"attnlab train: interrupted. {resume_hint(out, par.world, par.cp)}",
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
                           f"{resume_hint(out, par.world, par.cp)}") from None
    finally:
        # DistributedDataParallel holds the process group: let it go while the interpreter is
        # whole, so the group is torn down here and not during exit
        trainer = None
        gc.collect()
        par.close()
        signal.signal(signal.SIGINT, previous)
