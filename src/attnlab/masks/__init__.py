"""Structured attention masks. True = may attend.

    >>> from attnlab import masks
    >>> m = masks.causal() & masks.padding(key_lengths=[5, 3])
    >>> m.to_dense(6, 6).shape              # (Bm, Hm, L, S)
    torch.Size([2, 1, 6, 6])

Masks combine with `&`, `|`, `~`, build their bool matrix with `.to_dense(L, S)`, and classify
(query-block, key-block) tiles as EMPTY / PARTIAL / FULL with `.tiles(L, S, block_q, block_k)`.
Besides the built-in kinds, `from_function(fn)` takes FlexAttention's mask_mod convention, and
`alibi(...)` is a score modifier for `attention(score_mod=...)`.
"""

from attnlab.masks.alibi import ALiBi, alibi
from attnlab.masks.band import Band, Window, ragged_causal, window
from attnlab.masks.base import EMPTY, FULL, PARTIAL, Mask
from attnlab.masks.block_diagonal import BlockDiagonal, block_causal, block_diagonal
from attnlab.masks.dense import from_dense
from attnlab.masks.function import FunctionMask, from_function
from attnlab.masks.positional import causal, prefix_lm, sliding_window
from attnlab.masks.sequence import document, padding

__all__ = [
    "EMPTY",
    "FULL",
    "PARTIAL",
    "ALiBi",
    "Band",
    "BlockDiagonal",
    "FunctionMask",
    "Mask",
    "Window",
    "alibi",
    "block_causal",
    "block_diagonal",
    "causal",
    "document",
    "from_dense",
    "from_function",
    "padding",
    "prefix_lm",
    "ragged_causal",
    "sliding_window",
    "window",
]
