"""Structured attention masks. True = may attend.

    >>> from attnlab import masks
    >>> m = masks.causal() & masks.padding(key_lengths=[5, 3])
    >>> m.to_dense(6, 6).shape              # (Bm, Hm, L, S)
    torch.Size([2, 1, 6, 6])

Masks combine with `&`, `|`, `~`, build their bool matrix with `.to_dense(L, S)`, and classify
(query-block, key-block) tiles as EMPTY / PARTIAL / FULL with `.tiles(L, S, block_q, block_k)`.
"""

from attnlab.masks.base import EMPTY, FULL, PARTIAL, Mask
from attnlab.masks.dense import from_dense
from attnlab.masks.positional import causal, prefix_lm, sliding_window
from attnlab.masks.sequence import document, padding

__all__ = [
    "EMPTY",
    "FULL",
    "PARTIAL",
    "Mask",
    "causal",
    "document",
    "from_dense",
    "padding",
    "prefix_lm",
    "sliding_window",
]
