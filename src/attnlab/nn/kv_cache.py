"""KVCache: the keys and values one attention layer has already computed, for decoding.

Generation feeds a prompt once (prefill), then one token at a time (decode). Each step only
computes the new token's query, key and value; the cache returns all keys and values so far.
Caution: the buffers are preallocated to `max_length` positions; a step past that raises.
"""

from __future__ import annotations

import torch

from attnlab.errors import AttnlabError, check_positive_int, fmt_shape


class KVCache:
    """Keys and values (B, Hkv, max_length, D) of one layer; `length` positions are filled."""

    def __init__(self, batch_size: int, n_kv_heads: int, max_length: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device=None):
        for name, v in (("batch_size", batch_size), ("n_kv_heads", n_kv_heads),
                        ("max_length", max_length), ("head_dim", head_dim)):
            check_positive_int(name, v)
        shape = (batch_size, n_kv_heads, max_length, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_length(self) -> int:
        return self.keys.shape[2]

    def update(self, key: torch.Tensor, value: torch.Tensor):
        """Append key, value (B, Hkv, L, D); return all keys and values so far (B, Hkv, S, D)."""
        B, Hkv, _, D = self.keys.shape
        L = key.shape[-2]
        want = (B, Hkv, L, D)
        for name, x in (("key", key), ("value", value)):
            if tuple(x.shape) != want:
                raise AttnlabError(f"{name}: expected (B, Hkv, L, D) = {fmt_shape(want)} to fit "
                                   f"the cache, got {fmt_shape(x.shape)}")
        end = self.length + L
        if end > self.max_length:
            raise AttnlabError(f"cache: {self.length} positions filled + {L} new exceeds "
                               f"max_length {self.max_length}")
        # no autograd through the cache: it serves inference, and in-place writes keep it cheap
        self.keys[:, :, self.length:end] = key.detach()
        self.values[:, :, self.length:end] = value.detach()
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def reset(self) -> None:
        self.length = 0

    def __repr__(self):
        return f"KVCache({fmt_shape(self.keys.shape)}, length={self.length})"
