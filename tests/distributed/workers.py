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


def one_exits(rank: int, world: int):
    if rank == 1:
        os._exit(3)
    time.sleep(60)


def sleeps(rank: int, world: int):
    time.sleep(60)
