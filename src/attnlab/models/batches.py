"""Train/validation split and batches whose order depends only on (seed, step).

Batch `step` is drawn from a generator seeded with (seed, step), never from a running RNG, so a run
resumed at step s sees exactly the batches an uninterrupted run sees from step s on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.errors import AttnlabError


@dataclass
class TokenData:
    train: torch.Tensor  # (N_train,) int64 token ids
    val: torch.Tensor  # (N_val,)

    @classmethod
    def split(cls, ids: list[int], val_fraction: float, block_size: int) -> TokenData:
        """The first (1 - val_fraction) of the ids train, the rest validate."""
        data = torch.tensor(ids, dtype=torch.long)
        n_val = int(len(data) * val_fraction)
        train, val = data[: len(data) - n_val], data[len(data) - n_val:]
        for name, part in (("train", train), ("val", val)):
            if len(part) <= block_size + 1:
                raise AttnlabError(f"corpus: the {name} split has {len(part)} tokens, fewer than "
                                   f"block_size + 2 = {block_size + 2}")
        return cls(train, val)


def batch(data: torch.Tensor, batch_size: int, block_size: int, seed: int, index: int):
    """(x, y) of shape (batch_size, block_size): random windows and the same shifted by one."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    starts = torch.randint(0, len(data) - block_size - 1, (batch_size,), generator=g)
    offsets = torch.arange(block_size)
    x = data[starts[:, None] + offsets]  # (B, L)
    y = data[starts[:, None] + offsets + 1]  # (B, L)
    return x, y
