"""Small functions the spawn tests run on every rank (importable by name in the children)."""

from __future__ import annotations

import os
import time

import torch


def ranks(rank: int, world: int, tag: str):
    """This rank, the world, and every rank's number gathered through the group."""
    import attnlab.distributed as cp

    whole = cp.unshard(torch.tensor([float(rank)]), "contiguous", dim=0)
    return rank, world, tag, whole.tolist()


def one_raises(rank: int, world: int):
    """Rank 1 raises; the others wait in a collective for it (until the group's timeout)."""
    import attnlab.distributed as cp

    if rank == 1:
        raise ValueError("rank 1 gives up")
    return cp.unshard(torch.tensor([float(rank)]), "contiguous", dim=0).tolist()


def one_case_raises(rank: int, world: int):
    """The harness's run_each: case "a" raises on rank 1 while rank 0 waits in its collective;
    case "b" is a whole collective on both."""
    import attnlab.distributed as cp
    from distributed.harness import run_each, subgroups

    def run_case(c, group):
        if c["id"] == "a" and rank == 1:
            raise ValueError("case a fails on rank 1 alone")
        return cp.unshard(torch.tensor([float(rank)]), "contiguous", dim=0, group=group).tolist()

    cases = [{"id": "a", "P": 2}, {"id": "b", "P": 2}]
    return run_each(cases, run_case, subgroups(world, timeout_s=60.0, smallest=2), rank)


def one_exits(rank: int, world: int):
    if rank == 1:
        os._exit(3)
    time.sleep(60)


def sleeps(rank: int, world: int):
    time.sleep(60)


def _cp_call(rank: int, world: int, backward: bool):
    import attnlab.distributed as cp

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 16, 8, generator=g, dtype=torch.float64)
    xs = cp.shard(x).requires_grad_()
    out = cp.context_parallel_attention(xs, xs, xs, is_causal=True, strategy="ring")
    if backward:
        out.sum().backward()


def skips_backward(rank: int, world: int, catch: bool):
    """Calls 1 and 2 run forward and backward on every rank; in call 3 rank 1 skips the backward
    and returns. catch: rank 0 returns its error's message instead of raising."""
    from attnlab.errors import AttnlabError

    for call in (1, 2, 3):
        if call == 3 and rank == 1:
            _cp_call(rank, world, backward=False)
            return "returned"
        try:
            _cp_call(rank, world, backward=True)
        except AttnlabError as e:
            if not catch:
                raise
            return str(e)
    return "done"
