"""Run a function on P spawned processes joined in a gloo group on loopback, and collect what each
rank returns. Every group has a timeout and so does the join: a test never hangs.

The function must live in an importable module (this folder is on the path as `distributed`), as
spawned children import it by name.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import socket
import tempfile
import time
import traceback

import torch.multiprocessing as mp

GROUP_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subgroups(world: int):
    """{P: group of ranks 0..P-1} for P = 1..world (every rank must call new_group)."""
    import torch.distributed as dist

    t = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
    out = {P: dist.new_group(list(range(P)), timeout=t) for P in range(1, world)}
    out[world] = dist.group.WORLD
    return out


def _worker(rank, world, port, out_dir, fn, args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world,
                                timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
        result = {"ok": fn(rank, world, *args)}
    except BaseException:
        result = {"error": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def run_group(fn, world: int, *args, timeout_s: float = 150.0) -> list:
    """[fn(rank, world, *args) for each rank], run on `world` spawned processes."""
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(_worker, args=(world, free_port(), out_dir, fn, args),
                                 nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"process group of {world} did not finish in {timeout_s} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        results = []
        for r in range(world):
            with open(os.path.join(out_dir, f"rank{r}.pkl"), "rb") as f:
                res = pickle.load(f)
            if "error" in res:
                raise AssertionError(f"rank {r} failed:\n{res['error']}")
            results.append(res["ok"])
        return results
