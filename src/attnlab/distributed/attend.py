"""This rank's queries against one key block that arrived from somewhere: the loop over (query
piece, key piece) pairs shared by the ring and the all-gather strategies.

A pair whose tiles are all EMPTY is never computed; a FULL pair builds no mask; a PARTIAL pair
evaluates the mask on its global rows × columns and is skipped if nothing in it may attend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.distributed import comm
from attnlab.distributed.blocks import block_backward, merge
from attnlab.distributed.geometry import Geometry
from attnlab.distributed.layouts import Piece
from attnlab.masks import EMPTY


@dataclass
class Call:
    """One context-parallel call as this rank sees it."""

    geom: Geometry
    group: object
    rank: int
    world: int
    scale: float
    softcap: float | None
    acc: torch.dtype  # accumulation dtype: float64 for float64 inputs, else float32

    @property
    def q_pieces(self) -> list[Piece]:
        return self.geom.q.pieces(self.rank)

    def pairs(self, k_pieces: list[Piece], device):
        """(query piece index, query piece, key piece, allowed or None) of every pair to compute."""
        for qi, qp in enumerate(self.q_pieces):
            for kp in k_pieces:
                if self.geom.pair_class(qp, kp) == EMPTY:
                    continue
                allowed = self.geom.allowed(qp, kp)
                if allowed is not None:
                    allowed = allowed.to(device)
                    if not bool(allowed.any()):
                        continue
                yield qi, qp, kp, allowed


def _rows(x: torch.Tensor, p: Piece) -> torch.Tensor:
    return x[:, :, p.start:p.start + p.length]


def start_state(c: Call, q: torch.Tensor, Dv: int):
    """Per query piece: (out (B, H, Lp, Dv), lse (B, H, Lp)) of nothing seen yet."""
    B, H = q.shape[:2]
    return [(q.new_zeros(B, H, p.length, Dv, dtype=c.acc),
             q.new_full((B, H, p.length), float("-inf"), dtype=c.acc)) for p in c.q_pieces]


def forward_block(c: Call, state, q_acc, k_buf, v_buf, k_pieces: list[Piece]) -> None:
    """Merge the attention of every query piece over `k_pieces` of (k_buf, v_buf) into state."""
    from attnlab.ops import attention

    for qi, qp, kp, allowed in c.pairs(k_pieces, q_acc.device):
        k, v = _rows(k_buf, kp).to(c.acc), _rows(v_buf, kp).to(c.acc)
        # attnlab's own fused/tiled op on the block, in the accumulation dtype
        o, l = attention(_rows(q_acc, qp), k, v, attn_mask=allowed, scale=c.scale,
                         softcap=c.softcap, enable_gqa=k.shape[1] != q_acc.shape[1],
                         return_lse=True)
        comm.log_pair(qp.length, kp.length)
        state[qi] = merge(*state[qi], o, l)


def finish_state(c: Call, state, q: torch.Tensor, Dv: int):
    """out (B, H, L_local, Dv) in acc dtype and lse (B, H, L_local), rows in local order."""
    B, H, n = q.shape[:3]
    out = q.new_zeros(B, H, n, Dv, dtype=c.acc)
    lse = q.new_full((B, H, n), float("-inf"), dtype=c.acc)
    for (o, l), p in zip(state, c.q_pieces):
        out[:, :, p.start:p.start + p.length] = o
        lse[:, :, p.start:p.start + p.length] = l
    return out, lse


def backward_block(c: Call, saved, dq_acc, k_buf, v_buf, k_pieces: list[Piece]):
    """Add this block's dq into dq_acc; return (dk, dv) (B, Hkv, rows of k_buf, D|Dv), acc dtype.

    `saved` = (q_acc, out_acc, lse, dout_acc, dlse), each over this rank's local rows.
    """
    q_acc, out, lse, dout, dlse = saved
    dk = torch.zeros(k_buf.shape, dtype=c.acc, device=k_buf.device)
    dv = torch.zeros(v_buf.shape, dtype=c.acc, device=v_buf.device)
    for _, qp, kp, allowed in c.pairs(k_pieces, q_acc.device):
        dq_b, dk_b, dv_b = block_backward(
            _rows(q_acc, qp), _rows(k_buf, kp).to(c.acc), _rows(v_buf, kp).to(c.acc), allowed,
            c.scale, c.softcap, _rows(out, qp), lse[:, :, qp.start:qp.start + qp.length],
            _rows(dout, qp), dlse[:, :, qp.start:qp.start + qp.length])
        _rows(dq_acc, qp).add_(dq_b)
        _rows(dk, kp).add_(dk_b)
        _rows(dv, kp).add_(dv_b)
    return dk, dv
