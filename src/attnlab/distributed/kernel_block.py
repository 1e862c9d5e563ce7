"""A key block as whole interval-kernel calls: every query row of this rank against every key
row of a block, one call per span of the block, not one per (query piece, key piece) pair.

Under an interval-shaped mask (causal, windows, documents, their `&`; or no mask) query row i
may attend the global keys lo_i <= j < hi_i. A block's rows hold global positions; where those
ascend, the keys of the block that row i may attend are one run of its rows,
[searchsorted(pos, lo_i), searchsorted(pos, hi_i)): local intervals, exact, whatever the layout
(a zigzag shard's two chunks, a striped shard, a halo). So a block is one kernel call per *span*
— a run of its pieces whose positions ascend — in place of the pair loop's call, mask, merge and
checks per pair (`attend.Call.pairs`): a ring step at zigzag P = 2 makes 1 call where the pairs
made 3, and a one-rank ring makes exactly the call one process makes.

The spans are used when the kernel runs the block as one process would run it: no dropout (its
keyed mask is per pair); float32 accumulation (float32, float16 and bfloat16 inputs) on the CPU,
with the kernel built and on; and no NaN/Inf in the block's keys and values or this rank's
queries (those take the pair loop, which poisons exactly the rows that may attend them, as
`ops.nonfinite` does in one process).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.distributed.layouts import Piece
from attnlab.ops import kernels, nonfinite
from attnlab.ops.lse import merge_into

#: the pair loop instead of spans everywhere (tests compare the two; a switch for bisecting)
ENABLED = True


@dataclass(frozen=True)
class Span:
    """Rows [a, b) of a key block against this rank's query rows [r0, r1), which attend the
    block's rows lo <= j < hi (int32 (Bm, Hm, r1 − r0), relative to a)."""

    a: int
    b: int
    r0: int
    r1: int
    lo: torch.Tensor
    hi: torch.Tensor


def spans(c, q_acc: torch.Tensor, k_buf, v_buf, k_pieces: list[Piece]) -> list[Span] | None:
    """The block as kernel calls, or None when the pair loop must run it (see the module
    docstring). `c` is the strategy's `attend.Call`. Found once per block of a call: the
    backward gets what the forward found (its blocks hold the same rows, saved unchanged)."""
    key = ("kernel_block.spans", block_key(k_buf, k_pieces))
    if key not in c.memo:
        c.memo[key] = _find(c, q_acc, k_buf, v_buf, k_pieces)
    return c.memo[key]


def block_key(k_buf, k_pieces: list[Piece]) -> tuple:
    """What tells a call's key blocks apart: their rows and the global positions they hold."""
    return (k_buf.shape[2], tuple((p.start, p.length, int(p.positions[0]), int(p.positions[-1]))
                                  for p in k_pieces if p.length))


def _find(c, q_acc, k_buf, v_buf, k_pieces) -> list[Span] | None:
    g = c.geom
    if not (ENABLED and c.dropout_p == 0 and q_acc.device.type == "cpu"
            and q_acc.dtype == torch.float32
            and (g.mask is None or g.intervals is not None) and kernels.available()):
        return None
    block = _spans_of(c, q_acc.shape[2], k_buf, k_pieces)
    if block is None or not (nonfinite.all_finite(k_buf) and nonfinite.all_finite(v_buf)
                             and _queries_finite(c, q_acc)):
        return None
    return block


def _spans_of(c, n: int, k_buf, k_pieces: list[Piece]) -> list[Span] | None:
    """The spans of a block from the geometry alone (None: its pieces do not tile its rows in
    order); found once per geometry, rank and block."""
    key = ("kernel_block.spans", c.rank, n, block_key(k_buf, k_pieces))
    if key not in c.geom._cache:
        runs = _runs(k_pieces)
        out = None
        if runs is not None:
            glo, ghi = _row_bounds(c, n)  # int64 (Bm, Hm, n): global key bounds per row
            out = []
            for a, b, pos in runs:
                s = _span(a, b, 0, torch.searchsorted(pos, glo), torch.searchsorted(pos, ghi))
                if s is not None:
                    out.append(s)
        c.geom._cache[key] = out
    return c.geom._cache[key]


def _span(a: int, b: int, r0: int, lo: torch.Tensor, hi: torch.Tensor) -> Span | None:
    """The Span of key rows [a, b) for query rows r0 … r0 + n − 1 attending lo <= j < hi
    ((Bm, Hm, n), relative to a), cut to the rows that attend any; None when none does."""
    live = (lo < hi).reshape(-1, lo.shape[-1]).any(0).nonzero()  # (m, 1) ascending
    if live.numel() == 0:
        return None
    i, j = int(live[0, 0]), int(live[-1, 0]) + 1
    return Span(a, b, r0 + i, r0 + j, lo[..., i:j].to(torch.int32), hi[..., i:j].to(torch.int32))


def tiles(s: Span, n: int) -> list[tuple[int, int, list[Span]]]:
    """s in chunks of at most n keys, [(a, b, spans of keys [a, b) over at most n query rows
    each, every one cut to the rows that attend it)]."""
    if s.b - s.a <= n and s.r1 - s.r0 <= n:
        return [(s.a, s.b, [s])]
    out = []
    for a in range(s.a, s.b, n):
        b = min(a + n, s.b)
        lo = s.lo.clamp(a - s.a, b - s.a) - (a - s.a)  # (Bm, Hm, r1 − r0), relative to a
        hi = s.hi.clamp(a - s.a, b - s.a) - (a - s.a)
        parts = [_span(a, b, s.r0 + i, lo[..., i:i + n], hi[..., i:i + n])
                 for i in range(0, s.r1 - s.r0, n)]
        out.append((a, b, [t for t in parts if t is not None]))
    return out


def _runs(k_pieces: list[Piece]):
    """[(a, b, positions (b − a,) int64)]: the block's rows [0, end) as maximal runs of pieces
    whose positions ascend; None when the pieces do not tile the rows from 0 in order."""
    groups, at = [], 0  # [(a, [positions of each piece])]
    for p in k_pieces:
        if p.start != at:
            return None
        at += p.length
        pos = p.positions
        if p.length == 0:
            continue
        if p.length > 1 and not bool((pos[1:] > pos[:-1]).all()):
            return None
        if groups and int(groups[-1][1][-1][-1]) < int(pos[0]):
            groups[-1][1].append(pos)
        else:
            groups.append((p.start, [pos]))
    return [(a, a + sum(len(x) for x in pos), torch.cat(pos)) for a, pos in groups]


def _row_bounds(c, n: int):
    """int64 (Bm, Hm, n): the global key bounds [lo, hi) of each of this rank's n query rows
    (rows no piece holds: empty); computed once per geometry, rank and n."""
    g = c.geom
    key = ("kernel_block.row_bounds", c.rank, n)
    if key not in g._cache:
        pos = torch.full((n,), -1, dtype=torch.int64)
        for p in c.q_pieces:
            pos[p.start:p.start + p.length] = p.positions
        held = pos >= 0
        if g.mask is None:
            lo = torch.zeros(1, 1, n, dtype=torch.int64)
            hi = torch.where(held, g.S, 0).reshape(1, 1, n)
        else:
            glo, ghi = g.intervals  # int32 (Bm, Hm, L)
            at = pos.clamp(min=0)
            lo = torch.where(held, glo[..., at].long(), 0)
            hi = torch.where(held, ghi[..., at].long(), 0)
        g._cache[key] = (lo, hi)
    return g._cache[key]


def _queries_finite(c, q_acc) -> bool:
    if "q finite" not in c.memo:
        c.memo["q finite"] = nonfinite.all_finite(q_acc)
    return c.memo["q finite"]


def forward(c, state, q_acc: torch.Tensor, k_buf, v_buf, block: list[Span]) -> None:
    """Merge every span's (out, lse) into state (an `attend.State`)."""
    for s in block:
        k, v = k_buf[:, :, s.a:s.b].to(c.acc), v_buf[:, :, s.a:s.b].to(c.acc)
        o, lse = kernels.interval_forward(q_acc[:, :, s.r0:s.r1], k, v, s.lo, s.hi,
                                          scale=c.scale, softcap=c.softcap)
        if (s.r0, s.r1) == (0, q_acc.shape[2]) and state.take(o, lse):
            continue  # the first block, over every row: its result is the state
        state.ready()
        merge_into(state.out[:, :, s.r0:s.r1], state.lse[:, :, s.r0:s.r1], o, lse)


def backward(c, saved, dq_acc, k_buf, v_buf, block: list[Span], overwrite: bool, head_groups,
             kv_heads: slice | None = None, into=None):
    """Add every span's dq into dq_acc; return the block's (dk, dv) (B, Hkv, rows, D|Dv) in
    the acc dtype, zeros where no row attends. overwrite: (k_buf, v_buf) are in the acc dtype and
    dead after this; they may be written over with the gradients, each part once it is read.
    head_groups(rows, keys): the (query heads, key/value heads) slices each span runs one after
    another (`attend.head_groups`); a span that runs head by head (a large one) goes in tiles of
    one layout chunk of rows and keys, so that a call's transients (its dq, dk, dv, the Kᵀ and
    Vᵀ it makes) are one head's over one chunk, as those of a (query piece, key piece) pair.
    kv_heads: only these key/value heads (and their query heads); into: (dk, dv) to add them
    to (a block's backward in parts, with whatever else arrived meanwhile), else written into
    zeros (or over the block, `overwrite`)."""
    q_acc, out, lse, dout, dlse = saved
    if dlse is not None and not bool(dlse.any()):
        dlse = None

    def grads(s: Span, hq, hk, k, v):  # (dk, dv) of span s, heads hk; its dq added in
        r = slice(s.r0, s.r1)
        lo, hi = (x if x.shape[1] == 1 else x[:, hq] for x in (s.lo, s.hi))
        dq_b, dk_b, dv_b = kernels.interval_backward(
            q_acc[:, hq, r], k, v, lo, hi, out[:, hq, r], lse[:, hq, r], dout[:, hq, r],
            None if dlse is None else dlse[:, hq, r], scale=c.scale, softcap=c.softcap)
        dq_acc[:, hq, r].add_(dq_b)
        return dk_b, dv_b

    def groups_of(s: Span):
        groups = head_groups(s.r1 - s.r0, s.b - s.a)
        return groups if kv_heads is None else _only(groups, kv_heads, q_acc.shape[1] // Hkv)

    m, Hkv = k_buf.shape[2], k_buf.shape[1]
    if len(block) == 1 and (block[0].a, block[0].b) == (0, m) and kv_heads is None:
        groups = groups_of(block[0])
        if len(groups) == 1:  # one call over every row: its results are the block's
            return grads(block[0], *groups[0], k_buf.to(c.acc), v_buf.to(c.acc))
    if into is not None:
        (dk_to, dv_to), overwrite = into, False
    elif overwrite:
        dk_to, dv_to = k_buf, v_buf
    else:
        dk_to = kernels.zeros(*k_buf.shape, dtype=c.acc, device=k_buf.device)
        dv_to = kernels.zeros(*v_buf.shape, dtype=c.acc, device=v_buf.device)
    done, tile = 0, max(c.geom.q.chunk, c.geom.k.chunk)
    for whole in block:
        groups = groups_of(whole)
        split = tiles(whole, tile) if len(groups) > 1 else [(whole.a, whole.b, [whole])]
        for a, b, parts in split:
            if a > done and overwrite:
                dk_to[:, :, done:a].zero_()
                dv_to[:, :, done:a].zero_()
            done = b
            for hq, hk in groups:
                dk = dv = None  # (B, heads hk, b − a, D|Dv): summed over the parts' rows
                k, v = k_buf[:, hk, a:b].to(c.acc), v_buf[:, hk, a:b].to(c.acc)
                for s in parts:
                    dk_b, dv_b = grads(s, hq, hk, k, v)
                    if dk is None:
                        dk, dv = dk_b, dv_b
                    else:
                        dk.add_(dk_b)
                        dv.add_(dv_b)
                if dk is None and overwrite:
                    dk_to[:, hk, a:b].zero_()
                    dv_to[:, hk, a:b].zero_()
                elif dk is not None and into is not None:  # onto what is there already
                    dk_to[:, hk, a:b].add_(dk)
                    dv_to[:, hk, a:b].add_(dv)
                elif dk is not None:  # k, v are read; now their rows may take the gradients
                    dk_to[:, hk, a:b].copy_(dk)
                    dv_to[:, hk, a:b].copy_(dv)
    if m > done and overwrite:
        dk_to[:, :, done:].zero_()
        dv_to[:, :, done:].zero_()
    return dk_to, dv_to


def _only(groups, kv: slice, G: int):
    """`head_groups`' (query heads, key/value heads) slices cut to the key/value heads kv (and
    their G query heads each)."""
    out = []
    for hq, hk in groups:
        if hk == slice(None):
            out.append((slice(kv.start * G, kv.stop * G), kv))
        elif kv.start <= hk.start < kv.stop:
            out.append((hq, hk))
    return out
