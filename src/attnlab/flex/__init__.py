"""FlexAttention's API on attnlab: the one-import switch for code written for torch's Flex.

    # was: from torch.nn.attention.flex_attention import flex_attention, create_block_mask
    from attnlab.flex import flex_attention, create_block_mask

    block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=L, KV_LEN=S, device="cpu")
    out = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)
    out.sum().backward()                                          # trains on a CPU

`flex_attention` takes torch's arguments with torch's meaning (`attnlab.flex.api`); the BlockMask
is used as compiled Flex uses it (`attnlab.flex.block`); mask_mods and score_mods written for
Flex's scalar calls run unchanged (`attnlab.flexfn`). The rest of torch's Flex API
(create_block_mask, BlockMask, and_masks, or_masks, noop_mask, AuxRequest, AuxOutput) is
re-exported from torch as it is, so one import line changes.
"""

from __future__ import annotations

from torch.nn.attention.flex_attention import (
    AuxOutput,
    AuxRequest,
    BlockMask,
    and_masks,
    create_block_mask,
    noop_mask,
    or_masks,
)

from attnlab.flex.api import flex_attention, select_backend
from attnlab.flex.block import BlockMaskMask
from attnlab.flexfn import Adapted, vmapped

__all__ = [
    "Adapted",
    "AuxOutput",
    "AuxRequest",
    "BlockMask",
    "BlockMaskMask",
    "and_masks",
    "create_block_mask",
    "flex_attention",
    "noop_mask",
    "or_masks",
    "select_backend",
    "vmapped",
]
