"""MultiHeadAttention: torch.nn.MultiheadAttention's interface on attnlab.attention, plus GQA/MQA.

The forward's arguments mean what they mean in torch.nn.MultiheadAttention, so the module is a
drop-in (`MultiHeadAttention.from_torch(m)` copies the weights): `key_padding_mask` and a bool
`attn_mask` say True = *masked out*, the opposite of attnlab.attention's bool `attn_mask`. Pass an
attnlab structured mask as `mask=` for attnlab's convention (True = may attend).

Caution: a query row that may attend to nothing gives output 0 (torch gives NaN); `need_weights`
returns the softmax probabilities before dropout; `add_bias_kv` and `add_zero_attn` are not
supported.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.errors import AttnlabError, check_dropout, check_positive_int, fmt_shape
from attnlab.nn.attend import attend


class MultiHeadAttention(nn.Module):
    """Multi-head attention with `num_heads` query heads and `num_kv_heads` key/value heads.

    num_kv_heads = num_heads is classic MHA, 1 is multi-query (MQA), anything dividing num_heads
    is grouped-query attention (GQA). kdim/vdim are the key/value input sizes (cross-attention
    from a different width); the output has embed_dim features.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 kdim: int | None = None, vdim: int | None = None, batch_first: bool = False,
                 *, num_kv_heads: int | None = None, device=None, dtype=None):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        _check_heads(embed_dim, num_heads, num_kv_heads)
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim = embed_dim // num_heads
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.dropout, self.batch_first = check_dropout(dropout, "dropout"), batch_first
        kv = num_kv_heads * self.head_dim
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, embed_dim, **kw)
        self.k_proj = nn.Linear(self.kdim, kv, **kw)
        self.v_proj = nn.Linear(self.vdim, kv, **kw)
        self.out_proj = nn.Linear(embed_dim, embed_dim, **kw)

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadAttention:
        """A MultiHeadAttention with `m`'s sizes, options and (copied) weights."""
        if not isinstance(m, nn.MultiheadAttention):
            raise AttnlabError(f"m: expected torch.nn.MultiheadAttention, got {type(m).__name__}")
        if m.bias_k is not None or m.add_zero_attn:
            raise AttnlabError("m: add_bias_kv and add_zero_attn are not supported")
        w = m.out_proj.weight
        new = cls(m.embed_dim, m.num_heads, m.dropout, bias=m.in_proj_bias is not None,
                  kdim=m.kdim, vdim=m.vdim, batch_first=m.batch_first, device=w.device,
                  dtype=w.dtype)
        with torch.no_grad():
            if m._qkv_same_embed_dim:
                wq, wk, wv = m.in_proj_weight.chunk(3)  # (3E, E) -> 3 x (E, E)
            else:
                wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
            for lin, wt in ((new.q_proj, wq), (new.k_proj, wk), (new.v_proj, wv)):
                lin.weight.copy_(wt)
            if m.in_proj_bias is not None:
                for lin, b in zip((new.q_proj, new.k_proj, new.v_proj), m.in_proj_bias.chunk(3)):
                    lin.bias.copy_(b)
            new.out_proj.load_state_dict(m.out_proj.state_dict())
        return new.train(m.training)

    def forward(self, query, key=None, value=None, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False, *, mask=None):
        """(output, weights or None), like torch.nn.MultiheadAttention.

        query (L, B, E) or (B, L, E) with batch_first, or unbatched (L, E); key/value default to
        query (self-attention). key_padding_mask (B, S): True = padding, ignored. attn_mask (L, S)
        or (B·H, L, S): bool True = may not attend, or float added to the scores. is_causal adds
        a top-left causal mask. weights: (B, L, S) averaged over heads, or (B, H, L, S).
        """
        key = query if key is None else key
        value = key if value is None else value
        unbatched = query.dim() == 2
        q_in, k_in, v_in = (self._to_bld(x, name, unbatched)
                            for x, name in ((query, "query"), (key, "key"), (value, "value")))
        B, L, _ = q_in.shape
        S = k_in.shape[1]
        q = self._heads(self.q_proj(q_in), self.num_heads)  # (B, H, L, D)
        k = self._heads(self.k_proj(k_in), self.num_kv_heads)  # (B, Hkv, S, D)
        v = self._heads(self.v_proj(v_in), self.num_kv_heads)  # (B, Hkv, S, D)
        dense = self._dense_mask(key_padding_mask, attn_mask, B, L, S, unbatched)
        out, w, _ = attend(q, k, v, need_weights=need_weights, attn_mask=dense, mask=mask,
                           is_causal=bool(is_causal),
                           dropout_p=self.dropout if self.training else 0.0)
        out = self.out_proj(out.transpose(1, 2).reshape(B, L, self.embed_dim))  # (B, L, E)
        if unbatched:
            out = out[0]
        elif not self.batch_first:
            out = out.transpose(0, 1)  # (B, L, E) -> (L, B, E)
        if w is not None:
            w = w.mean(dim=1) if average_attn_weights else w  # (B, H, L, S) -> (B, L, S)
            w = w[0] if unbatched else w
        return out, w

    def _to_bld(self, x, name, unbatched):
        """(B, L, E) from the caller's layout."""
        if not isinstance(x, torch.Tensor) or x.dim() != (2 if unbatched else 3):
            shape = fmt_shape(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            want = "(L, E)" if unbatched else "(B, L, E)" if self.batch_first else "(L, B, E)"
            raise AttnlabError(f"{name}: expected {want} like query, got {shape}")
        if unbatched:
            return x[None]
        return x if self.batch_first else x.transpose(0, 1)  # (L, B, E) -> (B, L, E)

    def _heads(self, x, n):
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)  # (B, T, n·D) -> (B, n, T, D)

    def _dense_mask(self, key_padding_mask, attn_mask, B, L, S, unbatched):
        """One attnlab attn_mask (bool True = may attend, or float bias) broadcastable to
        (B, H, L, S), from torch's key_padding_mask and attn_mask conventions."""
        merged = None
        if attn_mask is not None:
            a = attn_mask
            if a.dim() == 3:
                if a.shape[0] != B * self.num_heads:
                    raise AttnlabError(f"attn_mask: expected (B·H, L, S) = "
                                       f"{fmt_shape((B * self.num_heads, L, S))}, got "
                                       f"{fmt_shape(a.shape)}")
                a = a.view(B, self.num_heads, L, S)  # (B·H, L, S) -> (B, H, L, S)
            elif tuple(a.shape) != (L, S):
                raise AttnlabError(f"attn_mask: expected (L, S) = {fmt_shape((L, S))} or "
                                   f"(B·H, L, S), got {fmt_shape(a.shape)}")
            merged = ~a if a.dtype == torch.bool else a
        if key_padding_mask is not None:
            kpm = key_padding_mask[None] if unbatched else key_padding_mask
            if tuple(kpm.shape) != (B, S):
                raise AttnlabError(f"key_padding_mask: expected (B, S) = {fmt_shape((B, S))}, "
                                   f"got {fmt_shape(key_padding_mask.shape)}")
            if kpm.dtype != torch.bool:  # float padding masks are added, as in torch
                pad = kpm[:, None, None, :]  # (B, 1, 1, S)
                if merged is None:
                    merged = pad
                elif merged.dtype == torch.bool:
                    merged = torch.where(merged, pad, float("-inf"))
                else:
                    merged = merged + pad
            else:
                keep = ~kpm[:, None, None, :]  # (B, 1, 1, S): True = real key
                if merged is None or merged.dtype == torch.bool:
                    merged = keep if merged is None else merged & keep
                else:
                    merged = merged.masked_fill(~keep, float("-inf"))
        return merged


def _check_heads(embed_dim, num_heads, num_kv_heads):
    for name, v in (("embed_dim", embed_dim), ("num_heads", num_heads),
                    ("num_kv_heads", num_kv_heads)):
        check_positive_int(name, v)
    if embed_dim % num_heads:
        raise AttnlabError(f"num_heads: embed_dim {embed_dim} is not divisible by num_heads "
                           f"{num_heads}")
    if num_heads % num_kv_heads:
        raise AttnlabError(f"num_kv_heads: num_heads {num_heads} is not a multiple of "
                           f"num_kv_heads {num_kv_heads}")
