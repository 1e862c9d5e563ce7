"""CausalSelfAttention: the attention block of a GPT, with KV-cache decoding and optional RoPE.

Without a cache every token sees itself and the tokens before it (top-left causal, the fused
kernel's `is_causal=True`). With a cache, L new queries follow the cache's earlier keys, so the
causal diagonal is aligned bottom-right: query i of the new tokens sees keys j <= i + (S - L).

With a context-parallel handle (`attnlab.distributed.ContextParallel`, handed in: this module never
imports torch.distributed), x holds this rank's rows of the sequence and `positions` their global
positions; attention runs through the handle across its group. Attention dropout there is keyed
by global position (`attnlab.distributed.keyed`: the same masks for any number of ranks), with
`dropout_seed` as the key (the trainer sets it per step and layer; None: drawn from torch's
generator on the group's rank 0), not drawn from torch's random stream as in one process.
Caution: under context parallelism there is no KV cache and no record.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab import masks
from attnlab.capture import AttentionCall
from attnlab.errors import AttnlabError, check_dropout
from attnlab.interventions import active as interventions
from attnlab.nn.attend import attend
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.mha import _check_heads
from attnlab.nn.rotary import RotaryEmbedding


def _record(q, k, v, w, scale: float) -> AttentionCall:
    """The record of one call: q, k, v as used (after rotary, with the cache), k/v heads repeated
    per query head, and what each query may see (bottom-right causal; top-left when S == L)."""
    B, H, L, _ = q.shape
    S = k.shape[-2]
    groups = H // k.shape[-3]
    allowed = torch.ones(L, S, dtype=torch.bool, device=q.device).tril(S - L)  # (L, S)
    k = k.repeat_interleave(groups, dim=-3)  # (B, Hkv, S, D) -> (B, H, S, D)
    v = v.repeat_interleave(groups, dim=-3)
    return AttentionCall(layer=None, query=q, key=k, value=v, allowed=allowed.expand(B, 1, L, S),
                         weights=w, scale=scale, causal=True)


#: the mask of every cached step: one object, so its intervals per (L, S) are computed once for
#: all layers and the op's cheap path (`ops/cheap.py`, plans per mask object) serves the layers
#: after the first of each step
CACHED_CAUSAL = masks.causal(align="bottom_right")


class CausalSelfAttention(nn.Module):
    """Causal self-attention over (B, L, d_model) with n_heads query and n_kv_heads k/v heads."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, *,
                 bias: bool = True, dropout: float = 0.0, rotary: bool = False,
                 rope_base: float = 10000.0, context_parallel=None):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        _check_heads(d_model, n_heads, n_kv_heads)
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.dropout = check_dropout(dropout, "dropout")
        # one projection for q, k and v: a single matmul instead of three
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = RotaryEmbedding(self.head_dim, rope_base) if rotary else None
        self.kernel = None  # None = attnlab.attention; benchmarks swap in a peer
        self.context_parallel = context_parallel  # None: the whole sequence is here
        self.dropout_seed: int | None = None  # key of the attention dropout under a CP handle
        self.layer_idx: int | None = None  # the model's layer index: what interventions address

    def new_cache(self, batch_size: int, max_length: int, *, dtype=None, device=None) -> KVCache:
        w = self.qkv.weight
        return KVCache(batch_size, self.n_kv_heads, max_length, self.head_dim,
                       dtype=dtype or w.dtype, device=device or w.device)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None,
                record: list | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """(B, L, d_model) -> (B, L, d_model). With `cache`, x holds the tokens after the cached
        ones; with `record` (a list), an `attnlab.capture.AttentionCall` is appended. With a
        context-parallel handle, `positions` (L,) are the global positions of x's rows."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise AttnlabError(f"x: expected (B, L, d_model={self.d_model}), got "
                               f"{tuple(x.shape)}")
        B, L, _ = x.shape
        if self.context_parallel is not None:
            return self._forward_cp(x, cache, record, positions)
        start = cache.length if cache is not None else 0
        q, k, v = self.project(x, start)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, Hkv, start + L, D)
            # the new queries are the last L positions: causal aligned to the bottom-right corner
            mask, is_causal = CACHED_CAUSAL, False
        else:
            mask, is_causal = None, True
        p_drop = self.dropout if self.training else 0.0
        out, w, scale = attend(q, k, v, need_weights=record is not None, mask=mask,
                               is_causal=is_causal, dropout_p=p_drop, kernel=self.kernel)
        if record is not None:  # the weights and the scale of the one validated call
            record.append(_record(q, k, v, w, scale))
        out = interventions.apply(self.layer_idx, out, v)  # an active intervention's edit
        y = out.transpose(1, 2).reshape(B, L, self.d_model)  # (B, H, L, D) -> (B, L, H·D)
        return self.out_proj(y)

    def _forward_cp(self, x, cache, record, positions) -> torch.Tensor:
        """This rank's rows of causal attention over a sequence split across the handle's ranks."""
        B, L, _ = x.shape
        if cache is not None or record is not None:
            raise AttnlabError("context_parallel: a KV cache or a record needs the whole sequence "
                               "in one process")
        if not isinstance(positions, torch.Tensor) or tuple(positions.shape) != (L,):
            got = tuple(positions.shape) if isinstance(positions, torch.Tensor) else positions
            raise AttnlabError(f"positions: expected the ({L},) global positions of x's rows, "
                               f"got {got}")
        q, k, v = self.project(x, positions=positions)
        p_drop = self.dropout if self.training else 0.0
        drop = {"dropout_p": p_drop, "dropout_seed": self.dropout_seed} if p_drop > 0 else {}
        out = self.context_parallel.attention(q, k, v, is_causal=True,
                                              enable_gqa=self.n_heads != self.n_kv_heads, **drop)
        y = out.transpose(1, 2).reshape(B, L, self.d_model)  # (B, H, L, D) -> (B, L, H·D)
        return self.out_proj(y)

    def project(self, x: torch.Tensor, start: int = 0, positions: torch.Tensor | None = None):
        """q (B, H, L, D), k and v (B, Hkv, L, D) of x, rotated for positions start..start+L-1
        (or `positions`, (L,), when given)."""
        B, L, _ = x.shape
        D = self.head_dim
        qkv = self.qkv(x)  # (B, L, (H + 2·Hkv)·D)
        q, k, v = qkv.split([self.n_heads * D, self.n_kv_heads * D, self.n_kv_heads * D], dim=-1)
        q = q.view(B, L, self.n_heads, D).transpose(1, 2)  # (B, L, H, D) -> (B, H, L, D)
        k = k.view(B, L, self.n_kv_heads, D).transpose(1, 2)  # -> (B, Hkv, L, D)
        v = v.view(B, L, self.n_kv_heads, D).transpose(1, 2)  # -> (B, Hkv, L, D)
        if self.rotary is not None:
            pos = torch.arange(start, start + L, device=x.device) if positions is None \
                else positions.to(x.device)
            q, k = self.rotary(q, pos), self.rotary(k, pos)
        return q, k, v
