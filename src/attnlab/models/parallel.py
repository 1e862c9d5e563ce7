"""The process layout of a data- and context-parallel training run, on torch.distributed.

N = D × C ranks form D data-parallel replicas of C context-parallel ranks each; rank
r = d·C + c is replica d's c-th sequence shard. Every rank builds the same global batch from
(seed, step) and keeps replica d's rows (`rows`), so the global batch and the data order do not
depend on D; the C ranks of a replica split each sequence in the zigzag layout through the
`ContextParallel` handle the GPT is given.

Gradients: each rank backpropagates C × its loss share (see `attnlab.models.gpt`: a share summed
over a replica's C ranks is the replica's mean); DistributedDataParallel averages over all N
ranks, so every rank ends with the gradient of the global batch's mean loss, the one-process
gradient.

Attention dropout under context parallelism is keyed by global position: `key_dropout` gives
every layer a key from (seed, step, layer), so each step drops other weights, a resumed run
drops the same ones again, and the masks are the same for any C.

Every process group has a timeout, so a rank whose peer died raises instead of waiting forever.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from attnlab.distributed import ContextParallel
from attnlab.distributed.keyed import step_seed
from attnlab.errors import AttnlabError

DEFAULT_TIMEOUT_S = 300.0


def launched() -> bool:
    """True in a worker started by torchrun / torch.distributed.run (or `attnlab train --nproc`)."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


@dataclass
class Parallel:
    """This rank's place in the (D, C) layout and the groups it talks through."""

    rank: int
    world: int
    dp: int
    cp: int
    handle: ContextParallel | None  # None when C = 1
    device: torch.device
    timeout_s: float

    @property
    def dp_rank(self) -> int:
        return self.rank // self.cp

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def rows(self, batch_size: int) -> slice:
        """The rows of a global batch this rank's replica trains on."""
        n = batch_size // self.dp
        return slice(self.dp_rank * n, (self.dp_rank + 1) * n)

    def key_dropout(self, model: torch.nn.Module, seed: int, step: int) -> None:
        """Key each layer's context-parallel attention dropout for training step `step`; each
        data-parallel replica gets its own keys."""
        if self.handle is None:
            return
        for layer, block in enumerate(model.blocks):
            block.attn.dropout_seed = step_seed(seed, step, layer, self.dp_rank)

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """DistributedDataParallel over all N ranks (parameters broadcast from rank 0)."""
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def sum(self, x: float) -> float:
        """The sum over all ranks of a number (a loss share)."""
        return self.sums([x])[0]

    def sums(self, xs: list[float]) -> list[float]:
        """The sums over all ranks of a few numbers, in one all-reduce."""
        t = torch.tensor(xs, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)  # (n,) fp64 from every rank -> the sums on every rank: 8n bytes
        return t.tolist()

    def max(self, x: float) -> float:
        """The largest of a number over all ranks (peak memory)."""
        t = torch.tensor([x], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # (1,) fp64 from every rank -> the maximum
        return float(t.item())

    def all_ok(self, ok: bool) -> bool:
        """True on every rank when `ok` is True on every rank (a barrier that carries a verdict)."""
        t = torch.tensor([int(bool(ok))], dtype=torch.int32, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)  # (1,) int32 from every rank -> the minimum
        return bool(t.item())

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def setup(dp: int | None = None, cp: int = 1, *, timeout_s: float = DEFAULT_TIMEOUT_S,
          backend: str | None = None) -> Parallel:
    """Join the group torchrun set up (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) as one rank
    of a (D, C) layout: gloo on CPU, nccl on CUDA; every group with `timeout_s`."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1 or world % cp:
        raise AttnlabError(f"--cp: expected a divisor of the {world} processes, got {cp!r}")
    dp = world // cp if dp is None else dp
    if dp * cp != world:
        raise AttnlabError(f"--dp, --cp: D × C = {dp} × {cp} = {dp * cp}, but there are {world} "
                           "processes (--nproc N needs N = D × C)")
    if timeout_s is None or not 0 < timeout_s < float("inf"):
        raise AttnlabError(f"--timeout: expected a positive number of seconds, got {timeout_s!r}")
    cuda = torch.cuda.is_available()
    backend = backend or ("nccl" if cuda else "gloo")
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timeout)
    handle = None
    if cp > 1:
        # every rank makes every replica's group, in the same order (new_group is collective)
        groups = [dist.new_group(list(range(d * cp, (d + 1) * cp)), timeout=timeout)
                  for d in range(dp)]
        handle = ContextParallel(groups[rank // cp], layout="zigzag")
    return Parallel(rank, world, dp, cp, handle, device, timeout_s)
