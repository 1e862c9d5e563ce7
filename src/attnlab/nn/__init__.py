"""Attention modules on attnlab.attention: MultiHeadAttention (a drop-in for
torch.nn.MultiheadAttention, plus GQA/MQA), CausalSelfAttention with KVCache decoding, and rotary
position embeddings.

    >>> import torch
    >>> from attnlab.nn import CausalSelfAttention
    >>> attn = CausalSelfAttention(64, n_heads=4, n_kv_heads=2, rotary=True)
    >>> x = torch.randn(2, 10, 64)                      # (B, L, d_model)
    >>> cache = attn.new_cache(batch_size=2, max_length=16)
    >>> y = attn(x[:, :9], cache)                       # prefill 9 tokens
    >>> y_last = attn(x[:, 9:], cache)                  # decode the 10th: equals attn(x)[:, 9:]
"""

from attnlab.nn.causal import CausalSelfAttention
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.mha import MultiHeadAttention
from attnlab.nn.rotary import RotaryEmbedding

__all__ = [
    "CausalSelfAttention",
    "KVCache",
    "MultiHeadAttention",
    "RotaryEmbedding",
]
