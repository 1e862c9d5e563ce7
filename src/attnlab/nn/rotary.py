"""Rotary position embeddings (RoPE): position enters attention by rotating queries and keys.

Each pair of channels (i, i + D/2) of a head is rotated by the angle position · base^(-2i/D), so
q·k depends on the positions only through their difference. The half-split pairing is the one
GPT-NeoX and LLaMA use ("rotate half").
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.errors import AttnlabError


class RotaryEmbedding(nn.Module):
    """Rotates (..., L, D) queries or keys by their positions; D must be even."""

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise AttnlabError(f"head_dim: rotary embeddings need an even head dim, got {head_dim}")
        if base <= 1:
            raise AttnlabError(f"rope_base: expected a number > 1, got {base!r}")
        self.head_dim, self.base = head_dim, float(base)
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        # not persistent: derived from (head_dim, base), so checkpoints need not carry it
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos, sin of shape (L, D) for integer positions (L,)."""
        angles = positions.to(self.inv_freq)[:, None] * self.inv_freq[None, :]  # (L, D/2)
        angles = torch.cat((angles, angles), dim=-1)  # (L, D): both halves of a pair share it
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos_sin(positions, x.dtype)
        return x * cos + rotate_half(x) * sin  # (..., L, D) * (L, D)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)
