"""This rank's queries against one key block that arrived from somewhere, shared by the ring
and the all-gather strategies: as whole interval-kernel calls where it can (`kernel_block`),
else the loop over (query piece, key piece) pairs.

Which pairs there are and how each runs: `pairs`.

With attention dropout (`Call.dropout_p` > 0) each block gets the keyed mask of its global rows ×
columns (`distributed.keyed`) and runs the plain block math of `blocks.dropout_forward` /
`dropout_backward`; without it the blocks are exactly the fused/tiled ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnlab.distributed import comm, kernel_block, keyed
from attnlab.distributed.blockmask import BlockOf
from attnlab.distributed.blocks import block_backward, dropout_backward, dropout_forward
from attnlab.distributed.geometry import Geometry
from attnlab.distributed.layouts import Piece
from attnlab.distributed.pairs import CAUSAL, block_pairs
from attnlab.ops import kernels, nonfinite
from attnlab.ops.lse import merge_into


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
    dropout_p: float = 0.0
    dropout_seed: int = 0  # the key of the dropout masks (see distributed.keyed)
    call_no: int = 0  # this process's count of context-parallel calls (errors name it)
    memo: dict = field(default_factory=dict, repr=False)  # facts of this call's inputs

    @property
    def q_pieces(self) -> list[Piece]:
        return self.geom.q.pieces(self.rank)

    def pairs(self, k_pieces: list[Piece], q: torch.Tensor, log: bool = False):
        """`pairs.block_pairs` of this call."""
        return block_pairs(self, k_pieces, q, log)


def _rows(x: torch.Tensor, p: Piece) -> torch.Tensor:
    return x[:, :, p.start:p.start + p.length]


def _local(c: Call, qi: int, rows: slice) -> slice:
    """`rows` of the shard as rows of query piece qi."""
    start = c.q_pieces[qi].start
    return slice(rows.start - start, rows.stop - start)


def keep(c: Call, q: torch.Tensor, qi: int, rows: slice, kp: Piece, head0: int = 0):
    """bool (B, H, rows, keys) of the block's surviving weights, or None without dropout."""
    if c.dropout_p == 0:
        return None
    pos = c.q_pieces[qi].positions[_local(c, qi, rows)]
    heads = torch.arange(head0, head0 + q.shape[1])
    return keyed.keep_mask(c.dropout_seed, c.dropout_p, q.shape[0], heads, pos.to(q.device),
                           kp.positions)


@dataclass
class State:
    """A forward's running result: out (B, H, L_local, Dv) and lse (B, H, L_local) in the acc
    dtype, and per query piece the views of its rows (`state[qi]`), merged into in place.

    Made on first use (`ready`): a first block that covers every row hands its own result over
    (`take`), so a call of one block (P = 1) merges nothing and zeroes nothing."""

    size: tuple  # (B, H, L_local, Dv)
    dtype: torch.dtype
    device: torch.device
    pieces: list  # this rank's query pieces
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None

    def ready(self) -> State:
        """out 0 and lse −inf where nothing is merged yet."""
        if self.out is None:
            B, H, n, Dv = self.size
            self.out = kernels.zeros(B, H, n, Dv, dtype=self.dtype, device=self.device)
            self.lse = torch.full((B, H, n), float("-inf"), dtype=self.dtype, device=self.device)
        return self

    def take(self, out: torch.Tensor, lse: torch.Tensor) -> bool:
        """Adopt (out, lse) of every row as the result when nothing is merged yet."""
        if self.out is not None or tuple(out.shape) != self.size or out.dtype != self.dtype:
            return False
        self.out, self.lse = out, lse.to(self.dtype)
        return True

    def __getitem__(self, qi: int):
        self.ready()
        p = self.pieces[qi]
        return (self.out[:, :, p.start:p.start + p.length],
                self.lse[:, :, p.start:p.start + p.length])


def start_state(c: Call, q: torch.Tensor, Dv: int) -> State:
    """The State of nothing seen yet: out 0, lse −inf."""
    B, H, n = q.shape[:3]
    return State((B, H, n, Dv), c.acc, q.device, c.q_pieces)


def forward_block(c: Call, state, q_acc, k_buf, v_buf, k_pieces: list[Piece]) -> None:
    """Merge the attention of every query piece over `k_pieces` of (k_buf, v_buf) into state.

    NaN/Inf go through `ops.nonfinite` block by block, as `attnlab.attention` treats the whole
    call: a block zeroes its poisoned keys/values (under a masked call, also in a block the mask
    leaves FULL) and query rows, and its rows that may attend them come out NaN, which the merge
    carries into the row's global result.

    An interval-shaped block with finite inputs runs as whole kernel calls (`kernel_block`)."""
    from attnlab.ops import dispatch
    from attnlab.ops.validate import make_problem

    block = kernel_block.spans(c, q_acc, k_buf, v_buf, k_pieces)
    if block is not None:
        _log_pairs(c, k_buf, k_pieces, q_acc)
        kernel_block.forward(c, state, q_acc, k_buf, v_buf, block)
        return
    for qi, rows, kp, allowed in c.pairs(k_pieces, q_acc, log=True):
        k, v = _rows(k_buf, kp).to(c.acc), _rows(v_buf, kp).to(c.acc)
        if c.dropout_p > 0:  # plain ops on the keyed mask of these rows x columns
            o, l = dropout_forward(q_acc[:, :, rows], k, v, allowed, c.scale, c.softcap,
                                   keep(c, q_acc, qi, rows, kp), c.dropout_p)
        else:  # attnlab's own fused/tiled op on the block, in the accumulation dtype
            causal = allowed is CAUSAL
            structured = allowed if isinstance(allowed, BlockOf) else None
            dense = None if causal or structured is not None else allowed
            p = make_problem(q_acc[:, :, rows], k, v, dense, 0.0, causal, c.scale,
                             k.shape[1] != q_acc.shape[1], mask=structured, softcap=c.softcap)
            o, l = dispatch.run("auto", p, need_lse=True, clean_always=c.geom.mask is not None)
        out, lse = state[qi]
        sl = _local(c, qi, rows)
        merge_into(out[:, :, sl], lse[:, :, sl], o, l)


def _log_pairs(c: Call, k_buf, k_pieces: list[Piece], q_acc) -> None:
    """Count the block's (query piece, key piece) pairs in an active `comm.record()`, as the
    pair loop does, when the block runs as whole kernel calls (found once per geometry, rank
    and block: they follow from those alone)."""
    if not comm.recording():
        return
    key = ("logged pairs", c.rank, kernel_block.block_key(k_buf, k_pieces))  # no dropout here
    pairs = c.geom._cache.get(key)
    if pairs is None:
        with comm.record() as log:  # every active record sees them too
            for _ in c.pairs(k_pieces, q_acc, log=True):
                pass
        c.geom._cache[key] = log.pairs
    else:
        for rows, cols in pairs:
            comm.log_pair(rows, cols)


def finish_forward(ctx, c: Call, state, q, k, v):
    """End a strategy's forward: keep (q, k, v, out, lse) for its backward (nothing of size S),
    return (out in q's dtype, lse)."""
    out, lse = state.ready().out, state.lse
    ctx.c = c
    ctx.save_for_backward(q, k, v, out, lse)
    return out.to(q.dtype), lse


def strategy_function(name: str, forward, backward) -> type[torch.autograd.Function]:
    """The torch.autograd.Function of a strategy (ring, all-gather) from its two passes:
    forward(ctx, q, k, v, c) -> (out, lse) and backward(ctx, c, q, k, v, saved, dq_acc) ->
    (dq, dk, dv, None), each run inside `comm.during` (its collectives named by call and pass)."""

    def fwd(ctx, q, k, v, c: Call):
        with comm.during(c.call_no, "forward"):
            return forward(ctx, q, k, v, c)

    def bwd(ctx, dout, dlse):
        c, q, k, v, saved, dq = start_backward(ctx, dout, dlse)
        with comm.during(c.call_no, "backward"):
            return backward(ctx, c, q, k, v, saved, dq)

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(fwd), "backward": staticmethod(bwd),
        "__module__": forward.__module__,
        "__doc__": f"Context-parallel attention's {name}: {forward.__module__}'s two passes."})


def start_backward(ctx, dout, dlse):
    """(c, q, k, v, saved, dq_acc) for a strategy's backward: `saved` as `backward_block` takes
    it, dq_acc zeros (B, H, L_local, D) in the accumulation dtype."""
    c: Call = ctx.c
    q, k, v, out, lse = ctx.saved_tensors
    dout, dlse = dout.to(c.acc), dlse.to(c.acc)
    q_acc = q.to(c.acc)
    if c.geom.mask is not None or not nonfinite.all_finite(q_acc):
        # as `ops.nonfinite` in one process: poisoned rows pass no gradient (NaN stays out of
        # every other row's), their weights are recomputed as those of a dead row
        dead = torch.isnan(lse)  # (B, H, L_local): rows the forward set to NaN
        if bool(dead.any()):
            dout = dout.masked_fill(dead[..., None], 0.0)
            dlse = dlse.masked_fill(dead, 0.0)
            out = out.masked_fill(dead[..., None], 0.0)
            lse = lse.masked_fill(dead, float("-inf"))
        q_acc = _finite_rows(q_acc)
    saved = (q_acc, out, lse, dout, dlse)
    return c, q, k, v, saved, kernels.zeros(*q_acc.shape, dtype=c.acc, device=q_acc.device)


def _finite_rows(x: torch.Tensor) -> torch.Tensor:
    """x (B, H|Hkv, n, D) with the rows that hold NaN/Inf zeroed (`ops.nonfinite`'s cleaning)."""
    if nonfinite.all_finite(x):
        return x
    bad = ~torch.isfinite(x).all(-1, keepdim=True)  # (B, H, n, 1)
    return x.masked_fill(bad, 0.0)


def backward_block(c: Call, saved, dq_acc, k_buf, v_buf, k_pieces: list[Piece],
                   reuse: bool = False, kv_heads: slice | None = None, into=None):
    """Add this block's dq into dq_acc; return (dk, dv) (B, Hkv, rows of k_buf, D|Dv), acc dtype.

    `saved` = (q_acc, out_acc, lse, dout_acc, dlse), each over this rank's local rows.
    reuse: (k_buf, v_buf) are a received block of this call, dead once its gradients exist: when
    they hold the acc dtype, the gradient of each (key piece, head group) is written over its
    own rows as soon as it is complete, and (k_buf, v_buf) are returned as (dk, dv) — no second
    block-sized buffer.
    kv_heads, into: a block that runs as whole kernel calls (`in_parts`) in parts, as
    `kernel_block.backward` takes them.
    """
    block = kernel_block.spans(c, saved[0], k_buf, v_buf, k_pieces)
    if block is not None:
        return kernel_block.backward(
            c, saved, dq_acc, k_buf, v_buf, block,
            reuse and k_buf.dtype == c.acc and v_buf.dtype == c.acc,
            lambda rows, keys: head_groups(c, saved[0], k_buf.shape[1], keys, rows),
            kv_heads, into)
    assert kv_heads is None and into is None, "a block in parts runs as whole kernel calls"
    if reuse and k_buf.dtype == c.acc and v_buf.dtype == c.acc:
        for kp in k_pieces:
            _piece_grads(c, saved, dq_acc, k_buf, v_buf, kp, _rows(k_buf, kp), _rows(v_buf, kp),
                         overwrite=True)
        return k_buf, v_buf
    dk = kernels.zeros(*k_buf.shape, dtype=c.acc, device=k_buf.device)
    dv = kernels.zeros(*v_buf.shape, dtype=c.acc, device=v_buf.device)
    for kp in k_pieces:
        _piece_grads(c, saved, dq_acc, k_buf, v_buf, kp, _rows(dk, kp), _rows(dv, kp))
    return dk, dv


def in_parts(c: Call, saved, k_buf, v_buf, k_pieces: list[Piece]) -> list[slice | None]:
    """The key/value heads of this block's backward in two parts (the ring computes its own
    block's around the last received one, so that the gradients it returns travel while the
    second part computes) when it runs as whole kernel calls over two or more heads; else
    [None] (all at once)."""
    Hkv = k_buf.shape[1]
    if Hkv < 2 or kernel_block.spans(c, saved[0], k_buf, v_buf, k_pieces) is None:
        return [None]
    return [slice(0, Hkv // 2), slice(Hkv // 2, Hkv)]


def _piece_grads(c: Call, saved, dq_acc, k_buf, v_buf, kp: Piece, dk_to, dv_to,
                 overwrite: bool = False) -> None:
    """The gradients of key piece kp summed over the query rows that may attend it, added into
    dk_to, dv_to (B, Hkv, kp.length, D|Dv) (overwrite: written over them, zeros where no row
    may attend), dq into dq_acc.

    A large block runs one key/value head (and its query heads) at a time (`head_groups`): the
    kernel reads the block's rows in place either way, and split, its outputs and transposes
    are one head's: the transient memory of a call falls by Hkv."""
    q_acc = saved[0]
    pairs = list(c.pairs([kp], q_acc))
    rows = max((r.stop - r.start for _, r, _, _ in pairs), default=0)
    for hq, hk in head_groups(c, q_acc, k_buf.shape[1], kp.length, rows):
        dk = dv = None  # overwrite: the sum (B, heads hk, kp.length, D|Dv) before it is written
        for qi, r, kq, allowed in pairs:  # kq: kp, or the sub-run of it the rows r may attend
            dk_b, dv_b = _pair_grads(c, saved, dq_acc, k_buf, v_buf, qi, r, kq, allowed, hq, hk)
            at = slice(kq.start - kp.start, kq.start - kp.start + kq.length)
            if not overwrite:
                dk_to[:, hk, at].add_(dk_b)
                dv_to[:, hk, at].add_(dv_b)
            elif dk is None and kq.length == kp.length:
                dk, dv = dk_b, dv_b
            else:
                if dk is None:
                    dk = kernels.zeros(*dk_b.shape[:2], kp.length, dk_b.shape[3], dtype=c.acc,
                                       device=dk_b.device)
                    dv = kernels.zeros(*dv_b.shape[:2], kp.length, dv_b.shape[3], dtype=c.acc,
                                       device=dv_b.device)
                dk[:, :, at].add_(dk_b)
                dv[:, :, at].add_(dv_b)
        if overwrite and dk is None:
            dk_to[:, hk].zero_()
            dv_to[:, hk].zero_()
        elif overwrite:
            dk_to[:, hk].copy_(dk)
            dv_to[:, hk].copy_(dv)


#: a backward block whose query rows (B·H·rows·D elements) exceed this runs head by head: 4 MiB
#: of fp32 rows (causal L = 32768, H = 4, P = 2 splits; L = 4096, H = 8 runs each block in one
#: kernel call, ~9% faster per rank than head by head)
HEAD_SPLIT_ELEMENTS = 1 << 20


def lean(c: Call, q: torch.Tensor) -> bool:
    """A call whose rows are large (B·H·L_local·D above HEAD_SPLIT_ELEMENTS, where blocks run
    head by head) holds fewer buffers at once instead of overlapping its transfers with compute:
    the ring's backward lets a step's sends and receives finish before it computes, so the
    copies it sent and the gradients coming back are never alive beside a block's transients
    (causal L = 32k, P = 2: the two ranks' blocks are of equal work, so little waits)."""
    B, H, n, D = q.shape
    return c.world > 1 and B * H * n * D > HEAD_SPLIT_ELEMENTS


def settle(c: Call, q: torch.Tensor) -> None:
    """Between the steps of a `lean` call: hand the blocks the kernel's pool kept back to the
    system (the next step's buffers differ in size: whole-shard blocks in the forward, one head's
    tiles in the backward), so they are not resident beside the fresh ones; the pages fault in
    again once per step (milliseconds against the seconds a large step computes)."""
    if lean(c, q):
        kernels.release_cached()


def head_groups(c: Call, q: torch.Tensor, Hkv: int, keys: int,
                rows: int) -> list[tuple[slice, slice]]:
    """(query heads, key/value heads) slices that a piece's backward (`keys` keys, at most `rows`
    query rows per call) runs one after another: one key/value head at a time when the rows
    are large and every pair's mask is the same for all heads (no per-head mask, no dropout: its
    keyed mask is per head), else all heads. A call over one rank holds what one process holds
    (nothing to fall with P): all heads."""
    B, H, _, D = q.shape
    every = [(slice(None), slice(None))]
    if c.world == 1 or c.dropout_p > 0 or B * H * max(rows, keys) * D <= HEAD_SPLIT_ELEMENTS:
        return every
    if c.geom.mask is not None and c.geom.mask.heads > 1:
        return every
    G = H // Hkv
    return [(slice(h * G, (h + 1) * G), slice(h, h + 1)) for h in range(Hkv)]


def _pair_grads(c: Call, saved, dq_acc, k_buf, v_buf, qi, r, kp, allowed, hq, hk):
    """(dk, dv) of heads hk of one (query rows r, key piece kp) pair, acc dtype; its dq (heads
    hq) added into dq_acc."""
    q_acc, out, lse, dout, dlse = saved
    causal = allowed is CAUSAL
    kb, vb, bad = _clean_keys(c, _rows(k_buf, kp)[:, hk].to(c.acc),
                              _rows(v_buf, kp)[:, hk].to(c.acc))
    blk = (q_acc[:, hq, r], kb, vb, None if causal else allowed, c.scale, c.softcap)
    grads = (out[:, hq, r], lse[:, hq, r], dout[:, hq, r], dlse[:, hq, r])
    if c.dropout_p > 0:  # the forward's mask again, from the same positions (all heads)
        dq_b, dk_b, dv_b = dropout_backward(*blk, keep(c, q_acc, qi, r, kp), c.dropout_p,
                                            *grads)
    else:
        dq_b, dk_b, dv_b = block_backward(*blk, *grads, is_causal=causal)
    if bad is not None:  # one process: the cleaned copy of a poisoned position takes them
        dk_b, dv_b = dk_b.masked_fill(bad, 0.0), dv_b.masked_fill(bad, 0.0)
    dq_acc[:, hq, r].add_(dq_b)
    return dk_b.to(c.acc), dv_b.to(c.acc)


def _clean_keys(c: Call, k: torch.Tensor, v: torch.Tensor):
    """(k, v, bad (B, Hkv, m, 1) or None): under a masked call, the positions whose key or value
    holds NaN/Inf zeroed, as `ops.nonfinite.clean` does in one process (a call without a mask
    computes with them, as one process does)."""
    if c.geom.mask is None or (nonfinite.all_finite(k) and nonfinite.all_finite(v)):
        return k, v, None
    bad = ~(torch.isfinite(k).all(-1, keepdim=True) & torch.isfinite(v).all(-1, keepdim=True))
    return k.masked_fill(bad, 0.0), v.masked_fill(bad, 0.0), bad
