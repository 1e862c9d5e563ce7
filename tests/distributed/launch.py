"""Run a function on P spawned processes joined in a gloo group on loopback, and collect what each
rank returns, through `attnlab.distributed.spawn`: every group has a timeout and so does the wait,
so a test never hangs, and the first rank that fails is the error.

The function must live in an importable module (this folder is on the path as `distributed`), as
spawned children import it by name.
"""

from __future__ import annotations

import datetime

from attnlab.distributed import spawn

GROUP_TIMEOUT_S = 30.0


def subgroups(world: int):
    """{P: group of ranks 0..P-1} for P = 1..world (every rank must call new_group)."""
    import torch.distributed as dist

    t = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
    out = {P: dist.new_group(list(range(P)), timeout=t) for P in range(1, world)}
    out[world] = dist.group.WORLD
    return out


def run_group(fn, world: int, *args, timeout_s: float = 150.0) -> list:
    """[fn(rank, world, *args) for each rank], run on `world` spawned processes."""
    return spawn(fn, world, *args, timeout_s=timeout_s, group_timeout_s=GROUP_TIMEOUT_S)
