"""Ring strategy: key/value shards travel around the ring while each rank computes.

Forward, step t = 0 … h: rank r holds the key shard of rank (r − t) mod P; the next hop is posted
before the step computes, so the transfer overlaps the compute. h, the number of hops, is the
farthest any rank's queries reach back along the ring under the mask (P − 1 for causal, 1 for a
sliding window narrower than a shard): hops no query needs are not run.

Backward: the key shards travel the same way again, now with fp32 (fp64) dK/dV accumulators
behind them: each rank adds its contribution to the accumulator of the shard it holds and passes
it on while computing the next step; after the last step every accumulator goes straight home.
dQ stays local. The forward's global out and lse are reused; nothing of size L×S is kept.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.distributed import attend
from attnlab.distributed.attend import Call
from attnlab.distributed.comm import Exchange

TAG_K, TAG_V, TAG_DK, TAG_DV, TAG_HOME_K, TAG_HOME_V = 11, 12, 13, 14, 15, 16


def padded(x: torch.Tensor, n_max: int) -> torch.Tensor:
    """(B, Hkv, n, D) -> (B, Hkv, n_max, D): zero rows appended (never attended)."""
    return F.pad(x, (0, 0, 0, n_max - x.shape[2])).contiguous()


def _hop(c: Call, phase: str, k_buf, v_buf) -> tuple[Exchange, torch.Tensor, torch.Tensor]:
    nxt, prv = (c.rank + 1) % c.world, (c.rank - 1) % c.world
    ex = Exchange(c.group, phase)
    ex.send(k_buf, nxt, TAG_K)  # (B, Hkv, S/P, D) -> rank+1: B·Hkv·(S/P)·D·bytes
    ex.send(v_buf, nxt, TAG_V)  # (B, Hkv, S/P, Dv) -> rank+1
    k_new = ex.recv(torch.empty_like(k_buf), prv, TAG_K)  # (B, Hkv, S/P, D) <- rank-1
    v_new = ex.recv(torch.empty_like(v_buf), prv, TAG_V)  # (B, Hkv, S/P, Dv) <- rank-1
    return ex.post(), k_new, v_new


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, c: Call):
        h, n_max, Dv = c.geom.ring_hops, c.geom.k.n_max, v.shape[-1]
        q_acc = q.to(c.acc)
        state = attend.start_state(c, q, Dv)
        k_buf, v_buf = padded(k, n_max), padded(v, n_max)
        for t in range(h + 1):
            nxt = _hop(c, "forward", k_buf, v_buf) if t < h else None
            src = (c.rank - t) % c.world
            attend.forward_block(c, state, q_acc, k_buf, v_buf, c.geom.k.pieces(src))
            if nxt is not None:
                nxt[0].wait()
                k_buf, v_buf = nxt[1], nxt[2]
        out, lse = attend.finish_state(c, state, q, Dv)
        ctx.c = c
        ctx.save_for_backward(q, k, v, out, lse)
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, dout, dlse):
        c: Call = ctx.c
        q, k, v, out, lse = ctx.saved_tensors
        h, n_max = c.geom.ring_hops, c.geom.k.n_max
        saved = (q.to(c.acc), out, lse, dout.to(c.acc), dlse.to(c.acc))
        dq = torch.zeros_like(saved[0])
        k_buf, v_buf = padded(k, n_max), padded(v, n_max)
        acc_ex, dk_acc, dv_acc = None, None, None
        for t in range(h + 1):
            nxt = _hop(c, "backward", k_buf, v_buf) if t < h else None
            src = (c.rank - t) % c.world
            dk_b, dv_b = attend.backward_block(c, saved, dq, k_buf, v_buf, c.geom.k.pieces(src))
            if acc_ex is not None:  # the accumulator of shard src, from rank-1's last step
                acc_ex.wait()
                dk_b, dv_b = dk_b + dk_acc, dv_b + dv_acc
            if nxt is not None:
                nxt[0].wait()
                k_buf, v_buf = nxt[1], nxt[2]
                # this step's accumulators travel on while the next step computes
                acc_ex = Exchange(c.group, "backward")
                to, frm = (c.rank + 1) % c.world, (c.rank - 1) % c.world
                acc_ex.send(dk_b, to, TAG_DK)  # (B, Hkv, S/P, D) fp32 -> rank+1
                acc_ex.send(dv_b, to, TAG_DV)  # (B, Hkv, S/P, Dv) fp32 -> rank+1
                dk_acc = acc_ex.recv(torch.empty_like(dk_b), frm, TAG_DK)  # <- rank-1
                dv_acc = acc_ex.recv(torch.empty_like(dv_b), frm, TAG_DV)
                acc_ex.post()
        if h > 0:  # dk_b, dv_b: the finished accumulators of shard (rank - h); send them home
            home = Exchange(c.group, "backward")
            home.send(dk_b, (c.rank - h) % c.world, TAG_HOME_K)  # (B, Hkv, S/P, D) fp32 -> owner
            home.send(dv_b, (c.rank - h) % c.world, TAG_HOME_V)
            dk_b = home.recv(torch.empty_like(dk_b), (c.rank + h) % c.world, TAG_HOME_K)
            dv_b = home.recv(torch.empty_like(dv_b), (c.rank + h) % c.world, TAG_HOME_V)
            home.post().wait()
        n = k.shape[2]
        return (dq.to(q.dtype), dk_b[:, :, :n].to(k.dtype), dv_b[:, :, :n].to(v.dtype), None)

