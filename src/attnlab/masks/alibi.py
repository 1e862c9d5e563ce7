"""ALiBi as a score modifier: per-head (or per-batch-and-head) linear position biases.

    causal form (symmetric=False):  s + slope[b, h] · (j - i - off)
    symmetric form (symmetric=True): s - slope[b, h] · |i + off - j|

with off = 0 (top-left), S - L (bottom-right) or key_lengths[b] - query_lengths[b] (each sequence
of a right-padded batch aligned on its real lengths). The symmetric form is flash-attention's
non-causal ALiBi (`-slope · |i + S - L - j|`); on every pair a matching causal mask allows, the two
forms agree, and flash-attention's causal bias `slope · (j - S + 1)` differs from the causal form by
a constant per row, which changes the lse but not the output.

An `ALiBi` is a score_mod in FlexAttention's convention, `mod(score, b, h, q_idx, kv_idx)`, with
the indices either broadcast tensors (attnlab's paths) or scalars (inside torch's Flex kernels);
the attention call binds it to its lengths and device first (`bind`), since bottom-right and
ragged alignments depend on L and S.
"""

from __future__ import annotations

import torch

from attnlab.errors import AttnlabError, check_choice, fmt_shape
from attnlab.masks.sequence import _lengths

ALIGNS = ("top_left", "bottom_right")


class ALiBi:
    """A bound or unbound ALiBi modifier; `bind(dims, device)` gives one ready for a call."""

    def __init__(self, slopes, symmetric: bool = False, align: str = "top_left",
                 query_lengths=None, key_lengths=None, *, _offsets=None):
        if not isinstance(slopes, torch.Tensor) or not slopes.is_floating_point() or \
                slopes.dim() not in (1, 2):
            raise AttnlabError(
                f"slopes: expected a float tensor of shape (H,) or (B, H), got "
                f"{type(slopes).__name__} {fmt_shape(getattr(slopes, 'shape', ()))}")
        if _offsets is None and not bool(torch.isfinite(slopes.detach()).all()):  # (bound
            # copies were checked when built: no host sync on the call's device)
            raise AttnlabError(f"slopes: expected finite values, got "
                               f"{slopes.detach().cpu().tolist()}"[:300])
        check_choice("align", align, ALIGNS)
        if not isinstance(symmetric, bool):
            raise AttnlabError(f"symmetric: expected a bool, got {symmetric!r}")
        self.slopes = slopes if slopes.dim() == 2 else slopes[None]  # (Bs, H)
        self.symmetric, self.align = symmetric, align
        self.q_len = None if query_lengths is None else _lengths("query_lengths", query_lengths)
        self.k_len = None if key_lengths is None else _lengths("key_lengths", key_lengths)
        if (self.q_len is not None or self.k_len is not None) and align != "bottom_right":
            raise AttnlabError("align: real query/key lengths define a bottom-right alignment; "
                               f"pass align='bottom_right', got {align!r}")
        self.offsets = _offsets  # int64 (Bo,) once bound; None = not bound yet

    def bind(self, dims, device) -> ALiBi:
        """This modifier for one call: shapes checked against `dims`, offsets from its L and S,
        tensors on `device`."""
        B = 1
        for n in dims.batch:
            B *= n
        Bs, H = self.slopes.shape
        if H != dims.H or Bs not in (1, B):
            raise AttnlabError(
                f"alibi slopes: expected (H,) = ({dims.H},) or (B, H) = ({B}, {dims.H}), got "
                f"{fmt_shape(self.slopes.shape if Bs > 1 else self.slopes.shape[1:])}")
        L, S = dims.L, dims.S
        if self.q_len is None and self.k_len is None:
            off = torch.tensor([0 if self.align == "top_left" else S - L])
        else:
            kl = torch.tensor([S]) if self.k_len is None else self.k_len
            ql = torch.tensor([L]) if self.q_len is None else self.q_len
            if kl.numel() not in (1, B) or ql.numel() not in (1, B):
                raise AttnlabError(f"alibi lengths: expected one per batch element ({B}), got "
                                   f"{kl.numel()} key and {ql.numel()} query lengths")
            for name, t, n in (("query_lengths", self.q_len, L), ("key_lengths", self.k_len, S)):
                if t is not None and int(t.max()) > n:
                    raise AttnlabError(f"alibi {name}: lengths {t.tolist()} exceed the padded "
                                       f"length {n}"[:200])
            off = kl - ql  # (Bo,)
        return ALiBi(self.slopes.to(device), self.symmetric, self.align, _offsets=off.to(device))

    def __call__(self, score, b, h, q_idx, kv_idx):
        if self.offsets is None:
            if self.align != "top_left" or self.q_len is not None or self.k_len is not None:
                raise AttnlabError("ALiBi: bind(dims, device) first; its alignment needs L and S")
            off = 0
        else:
            off = self.offsets[b] if self.offsets.numel() > 1 else self.offsets[0]
        slope = self.slopes[b if self.slopes.shape[0] > 1 else 0, h]
        rel = kv_idx - q_idx - off  # j - i - off
        if self.symmetric:
            rel = -rel.abs()
        return score + slope.to(score.dtype) * rel.to(score.dtype)

    def __repr__(self):
        return (f"alibi(slopes of shape {fmt_shape(self.slopes.shape)}, "
                f"symmetric={self.symmetric}, align={self.align!r})")


def alibi(slopes, symmetric: bool = False, align: str = "top_left", *, query_lengths=None,
          key_lengths=None) -> ALiBi:
    """ALiBi for `attention(score_mod=...)`: slopes (H,) or (B, H); `symmetric=True` is
    flash-attention's non-causal form -slope·|i + off - j|; align/lengths place the diagonal
    (top-left, bottom-right, or each sequence's real lengths)."""
    return ALiBi(slopes, symmetric, align, query_lengths, key_lengths)
