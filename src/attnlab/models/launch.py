"""Start N local workers through torch.distributed's elastic launcher: what
`torchrun --standalone --nproc-per-node N -m attnlab ARGS` does, called from Python.

Each worker is `python -m attnlab ARGS` with RANK, WORLD_SIZE, MASTER_ADDR, ... set, exactly as
under torchrun, so one code path serves `attnlab train --nproc N` on one machine and torchrun on
many. The launcher watches its workers; when one dies (a crash, kill -9) it stops the others and
`launch` raises an AttnlabError naming the ranks and how each ended. On Ctrl-C (SIGINT) the
launcher passes the SIGINT on to its workers and gives them `grace_s` seconds to finish the step,
save and exit before it kills them (a second Ctrl-C stops them at once with SIGTERM), then raises
KeyboardInterrupt; on SIGTERM it stops them at once.

A worker dies with its launcher: killed with kill -9, the launcher cannot stop its workers, so each
worker arms the kernel's parent-death signal (Linux `prctl(PR_SET_PDEATHSIG)`) and watches its
parent's pid from a thread (every platform), and ends itself with SIGKILL the moment the launcher
is gone: no orphan goes on training and saving over the checkpoint.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
import uuid

from attnlab.errors import AttnlabError

#: set in the workers' environment: `attnlab train --nproc` started them, so the launcher, not
#: rank 0, tells the user how the run ended
LOCAL_LAUNCH_ENV = "ATTNLAB_LOCAL_LAUNCH"
#: set in the workers' environment: the launcher's pid; a worker outlives it by at most a poll
LAUNCHER_PID_ENV = "ATTNLAB_LAUNCHER_PID"
#: a worker's exit code after Ctrl-C (the shell's 128 + SIGINT)
INTERRUPTED = 130


def launch(args: list[str], nproc: int, *, threads: int = 1, grace_s: float = 30.0) -> None:
    """Run `python -m attnlab *args` on `nproc` local processes; return when all succeeded."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"attnlab-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint="localhost:0",  # torchrun --standalone
        max_restarts=0,  # a failed rank stops the run; `--resume` continues from its checkpoint
        monitor_interval=0.1, start_method="spawn",
        shutdown_timeout=max(1, math.ceil(grace_s)),  # after Ctrl-C: finish the step and save
    )
    # torchrun's default for several local workers, set here so it does not warn about it
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    # the agent's lines (rendezvous, "closing signal", the failure) would bury the workers' own;
    # a failure comes back as the AttnlabError below
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    before = {k: os.environ.get(k) for k in (LOCAL_LAUNCH_ENV, LAUNCHER_PID_ENV)}
    os.environ[LOCAL_LAUNCH_ENV] = "1"  # the workers inherit the launcher's environment
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    try:
        elastic_launch(config, sys.executable)("-m", "attnlab", *args)
    except ChildFailedError as e:
        if all(f.exitcode == INTERRUPTED for f in e.failures.values()):
            raise KeyboardInterrupt("every worker was interrupted") from None  # SIGINT to them
        raise AttnlabError(describe_failures(e.failures, nproc)) from None
    except SignalException as e:  # Ctrl-C or a termination signal: the agent stopped the workers
        raise KeyboardInterrupt(str(e)) from None
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def die_with_launcher(poll_s: float = 0.25) -> bool:
    """In a worker started by `launch`: end this process with SIGKILL as soon as the launcher
    is gone. Returns False (doing nothing) in any other process."""
    try:
        launcher = int(os.environ.get(LAUNCHER_PID_ENV, "0"))
    except ValueError:
        return False
    if launcher <= 1:
        return False
    if os.getppid() == launcher:  # the launcher started this process itself (torch's way)
        _parent_death_signal(signal.SIGKILL)

        def gone() -> bool:  # a dead parent's children are reparented at once
            return os.getppid() != launcher
    else:  # an intermediate process, or the launcher died already

        def gone() -> bool:
            return not _alive(launcher)

    if gone():  # it died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)

    def watch():  # where prctl is missing, and should the kernel's signal not come
        while not gone():
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="attnlab-launcher-watch", daemon=True).start()
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, under another user
        return True
    return True


def _parent_death_signal(sig: int) -> bool:
    """Ask Linux to send `sig` to this process when its parent dies (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(1, int(sig), 0, 0, 0) == 0  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False


def describe_failures(failures: dict, nproc: int) -> str:
    """One line: which ranks failed and how, the cause first (ranks the launcher stopped with
    SIGTERM after it last)."""
    def order(item):
        rank, f = item
        return (f.exitcode == -signal.SIGTERM, f.timestamp, rank)

    parts = []
    for rank, f in sorted(failures.items(), key=order):
        if f.exitcode == -signal.SIGTERM:
            how = "was stopped"
        elif f.exitcode is not None and f.exitcode < 0:
            how = f"was killed by {_signal_name(-f.exitcode)}"
        else:
            how = f"exited with code {f.exitcode}"
        parts.append(f"rank {rank} (pid {f.pid}) {how}")
    said = any(f.exitcode is not None and f.exitcode > 0 for f in failures.values())
    return (f"the run of {nproc} processes stopped: " + "; ".join(parts)
            + (" (the workers' messages are above)" if said else ""))


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
