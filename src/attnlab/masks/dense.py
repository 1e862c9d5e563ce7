"""from_dense: any bool matrix as a Mask, for patterns the structured masks don't cover."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.errors import AttnlabError, fmt_shape
from attnlab.masks.base import Mask, as_4d, classify, pick


class Dense(Mask):
    """A bool tensor (L, S), (Hm, L, S) or (Bm, Hm, L, S); True = may attend."""

    def __init__(self, tensor):
        t = torch.as_tensor(tensor)
        if t.dtype != torch.bool:
            raise AttnlabError(
                f"from_dense: expected a bool tensor (True = may attend), got dtype {t.dtype}; "
                "pass float masks to attention(attn_mask=...) instead"
            )
        if not 2 <= t.dim() <= 4:
            raise AttnlabError(
                f"from_dense: expected shape (L, S), (H, L, S) or (B, H, L, S), "
                f"got {fmt_shape(t.shape)}"
            )
        self.tensor = as_4d(_own(t))  # (Bm, Hm, L, S): a copy, the caller's may change
        self.batch_size, self.heads = self.tensor.shape[0], self.tensor.shape[1]

    def check(self, L, S):
        if tuple(self.tensor.shape[-2:]) != (L, S):
            raise AttnlabError(
                f"from_dense: mask is {fmt_shape(self.tensor.shape[-2:])} but the scores are "
                f"(L, S) = ({L}, {S})"
            )

    def _block(self, rows, cols, L, S):
        t = self.tensor.to(rows.device)
        return t[:, :, rows][:, :, :, cols]

    def mask_mod(self, L, S, device=None):
        t = self.tensor.to(device)  # (Bm, Hm, L, S)
        pb, ph = pick(t.shape[0]), pick(t.shape[1])
        return lambda b, h, q, k: t[pb(b), ph(h), q, k]

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, L, S):
        bq = int(q_hi[0, 0] - q_lo[0, 0]) + 1
        bk = int(k_hi[0, 0] - k_lo[0, 0]) + 1
        nq, nk = q_lo.shape[0], k_lo.shape[1]
        t = self.tensor.to(q_lo.device)
        # pad to whole tiles; padding counts as "may attend" for fullness, "masked" for emptiness
        pad = (0, nk * bk - S, 0, nq * bq - L)
        tiles_any = F.pad(t, pad, value=False).reshape(*t.shape[:2], nq, bq, nk, bk)
        tiles_all = F.pad(t, pad, value=True).reshape(*t.shape[:2], nq, bq, nk, bk)
        return classify(tiles_all.all(-1).all(-2), ~tiles_any.any(-1).any(-2))

    def __repr__(self):
        return f"from_dense(tensor of shape {fmt_shape(self.tensor.shape)})"


def _own(t: torch.Tensor) -> torch.Tensor:
    """A copy of t that shares no memory with it; broadcast (stride 0) dims stay broadcast, so
    an expanded row costs one row, not the whole matrix."""
    t = t.detach()
    wide = [d for d in range(t.dim()) if t.stride(d) == 0 and t.shape[d] > 1]
    base = t
    for d in wide:
        base = base.narrow(d, 0, 1)
    return base.clone().expand(t.shape)


def from_dense(tensor) -> Dense:
    """A bool mask tensor (True = may attend) as a Mask (of a copy of it)."""
    return Dense(tensor)
