"""Run a function on P local processes joined in one process group, and collect what each returns.

    >>> from attnlab.distributed import spawn                     # doctest: +SKIP
    >>> spawn(my_module.work, 4, 4096)       # [work(0, 4, 4096), work(1, 4, 4096), ...]

For tests, benchmarks and trying things out on one machine (gloo over loopback, one thread per
process); `torchrun` is the launcher for real jobs. Every process joins the group with a timeout,
so no collective waits forever, and the caller never waits longer than `timeout_s`: the first rank
that raises, dies or runs out of time stops all of them, and `SpawnError` names it, with the
rank's own traceback.

Caution: the processes are started with "spawn", so `fn` and its arguments must be picklable and
`fn` importable by name (a module-level function; under `python script.py` the script counts).
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import socket
import tempfile
import time
import traceback

from attnlab.errors import AttnlabError


class SpawnError(RuntimeError):
    """A spawned rank failed, died or ran out of time; `rank` says which (None: no single one)."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, out_dir, fn, args, backend, group_timeout_s, threads):
    import torch

    from attnlab.distributed import comm

    torch.set_num_threads(threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        comm.init_group(backend, timeout_s=group_timeout_s, init_method=f"tcp://127.0.0.1:{port}",
                        rank=rank, world=world)
        result = {"ok": fn(rank, world, *args)}
    except BaseException:
        result = {"error": traceback.format_exc(), "at": time.time()}
    path = os.path.join(out_dir, f"rank{rank}.pkl")
    with open(path + ".tmp", "wb") as f:
        pickle.dump(result, f)
    os.replace(path + ".tmp", path)  # the parent sees a whole file or none
    comm.destroy_group()


def _check(world, timeout_s, group_timeout_s, threads) -> None:
    for name, v, ok in (("world", world, isinstance(world, int) and world >= 1),
                        ("threads", threads, isinstance(threads, int) and threads >= 1),
                        ("timeout_s", timeout_s, isinstance(timeout_s, (int, float))
                         and timeout_s > 0),
                        ("group_timeout_s", group_timeout_s,
                         isinstance(group_timeout_s, (int, float)) and group_timeout_s > 0)):
        if isinstance(v, bool) or not ok:
            raise AttnlabError(f"{name}: expected a positive number, got {v!r}")


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} before returning a result"


def _last_line(tb: str) -> str:
    return tb.strip().splitlines()[-1]


def _silent(world: int, errors: dict[int, dict], returned) -> tuple[int, str] | None:
    """(rank, headline) when a rank returned while another still waited for it: the error of
    attnlab's communication names the peer it waited for and what that peer was to run."""
    if not returned:
        return None
    for r in sorted(errors, key=lambda k: (errors[k]["at"], k)):
        last = _last_line(errors[r]["error"])
        m = re.search(r"\brank (\d+) did not run (the .+? call \d+)", last)
        if m and int(m[1]) in returned:
            s = int(m[1])
            return s, (f"rank {s} of {world} returned without running {m[2]}, which rank {r} "
                       f"waited for")
        if "did not run" in last:  # a collective: every rank that returned is a suspect
            s = min(returned)
            return s, (f"rank {s} of {world} returned while rank {r} still waited for it in a "
                       f"collective")
    return None


def _failure(world: int, errors: dict[int, dict], deaths: dict[int, int],
             returned=()) -> SpawnError:
    """The first failure: a rank that died (the others then lose their peer), a rank that returned
    while another waited for it, else the rank that raised first; the others' failures in one
    line each."""
    silent = None if deaths else _silent(world, errors, returned)
    if deaths:
        r = min(deaths)
        msg = f"rank {r} of {world} {_exit_reason(deaths[r])}"
    elif silent is not None:
        r, msg = silent
    else:
        r = min(errors, key=lambda k: (errors[k]["at"], k))
        msg = f"rank {r} of {world} failed: {_last_line(errors[r]['error'])}"
    also = [f"rank {k} {_exit_reason(c)}" for k, c in sorted(deaths.items()) if k != r]
    also += [f"rank {k}: {_last_line(e['error'])}" for k, e in sorted(errors.items()) if k != r]
    if also:
        msg += "\n(then " + "; ".join(also) + ")"
    if r in errors:
        msg += "\n\n" + errors[r]["error"]
    elif errors:  # the waiting rank's traceback
        first = min(errors, key=lambda k: (errors[k]["at"], k))
        msg += f"\n\nrank {first}:\n" + errors[first]["error"]
    return SpawnError(msg, rank=r)


def _collect(procs, out_dir: str, world: int, timeout_s: float) -> list:
    results: dict[int, object] = {}
    errors: dict[int, dict] = {}
    deadline, pause = time.monotonic() + timeout_s, 0.02
    while len(results) < world:
        deaths = {}
        for r in range(world):
            if r in results or r in errors:
                continue
            path = os.path.join(out_dir, f"rank{r}.pkl")
            code = procs[r].exitcode
            if not os.path.exists(path):
                if code is not None and not os.path.exists(path):  # gone without a word
                    deaths[r] = code
                continue
            with open(path, "rb") as f:
                res = pickle.load(f)
            if "error" in res:
                errors[r] = res
            else:
                results[r] = res["ok"]
        if errors or deaths:
            raise _failure(world, errors, deaths, set(results))
        if len(results) < world:
            if time.monotonic() > deadline:
                left = [r for r in range(world) if r not in results]
                raise SpawnError(f"the group of {world} did not finish in {timeout_s:g} s "
                                 f"(ranks {left} still running)")
            time.sleep(pause)
            pause = min(2 * pause, 0.2)
    return [results[r] for r in range(world)]


def spawn(fn, world: int, *args, timeout_s: float = 600.0, group_timeout_s: float = 60.0,
          backend: str = "gloo", threads: int = 1) -> list:
    """[fn(rank, world, *args) for each rank], run on `world` new local processes.

    Each process sets `threads` torch threads, joins a `backend` group of `world` ranks on
    127.0.0.1 with `group_timeout_s` as the timeout of every collective, calls fn and leaves the
    group. Returns the results in rank order.

    Raises:
        SpawnError: the first rank that raised (its traceback in the message), died (its exit
            code or signal), or the group still running after `timeout_s`; the other processes
            are killed.
        AttnlabError: bad arguments.
    """
    import torch.multiprocessing as mp

    _check(world, timeout_s, group_timeout_s, threads)
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _worker, args=(world, free_port(), out_dir, fn, args, backend, group_timeout_s,
                           threads),
            nprocs=world, join=False, start_method="spawn")
        try:
            return _collect(ctx.processes, out_dir, world, timeout_s)
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            for p in ctx.processes:
                p.join(timeout=10)
