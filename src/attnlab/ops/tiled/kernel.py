"""The tiled kernel, read top to bottom: the forward, the backward, the autograd Function, and the
two entry points the rest of attnlab calls; one call's Setup is `setup.py`, a chunk's mask and
scores, which the forward and the backward both recompute, `chunk.py`.

Three layers, as in flash-attention: `_fwd` / `_bwd` are pure functions returning (out, lse) and
(dq, dk, dv); `TiledAttention` is the thin autograd Function (it saves q, k, v, out and lse:
nothing of size L×S); `forward(problem)` is the runner the dispatcher calls, and
`backward(problem, out, lse, dout, dlse)` the backward alone, for callers that computed the
forward themselves, e.g. a context-parallel block whose rows' out and lse cover keys on other
ranks too (`attnlab.distributed.blocks`). Both outputs are differentiable: the lse's gradient
enters the backward's row term.

Each row block's chunks (`plan.py`) run either on plain PyTorch ops (`_pure_fwd_rows`,
`_pure_bwd_rows`, always available) or on PyTorch's fused CPU flash kernel (`_fused_fwd_rows`,
`_fused_bwd_rows`, whose arithmetic is `fused.py`), wherever `fused_cpu.applies`.

Glossary of the shape comments (the same letters everywhere in attnlab):

    B    batch (all leading batch dims flattened into one inside the kernel)
    H    query heads            Hkv  key/value heads (H = Hkv without GQA)
    L    query length           S    key/value length
    D    query/key head dim     Dv   value head dim
    G    query heads per key/value head, H / Hkv (grouped-query attention; 1 for MHA)
    N    B·Hkv: the batch of one batched matmul; grouped heads ride along the rows
    bq   query rows of one row block (at most plan.BLOCK_Q)
    ck   key columns of one chunk (a contiguous key range of the plan)
    G·bq the rows of one matmul: the G query heads of a key/value head, bq rows each

e.g. `s = (q @ kᵀ) · scale  # (N, G·bq, D) @ (N, D, ck) -> (N, G·bq, ck)`; `X|1` marks a dim
that may be 1 and broadcast.

Caution: no gradient flows to a float `attn_mask` or to ALiBi slopes (they are constants here;
"auto" picks the math backend when a float mask needs a gradient).
"""

from __future__ import annotations

import dataclasses

import torch

from attnlab.errors import AttnlabError
from attnlab.ops import fused_cpu, plain, scores, second_order
from attnlab.ops.problem import Problem
from attnlab.ops.tiled import fused
from attnlab.ops.tiled.chunk import (
    alive_columns,
    chunk_allowed,
    chunk_scores,
    fused_chunk,
    q_rows,
    stacked_rows,
)
from attnlab.ops.tiled.setup import Setup, dropout_keep, generator, make_setup

# ---------------------------------------------------------------------------------------------
# Forward: online softmax over the plan's chunks, never more than one chunk of scores
#
# For each query block, a running row max m, row sum l and unnormalised output acc are carried
# across the chunks (FlashAttention's recurrence):
#
#     m' = max(m, rowmax(s));  p = exp(s - m');  l' = l·exp(m - m') + rowsum(p)
#     acc' = acc·exp(m - m') + p @ v;            out = acc / l;  lse = m + log(l)
#
# Rows that may attend to nothing keep m = -inf; the shift of the exponent is 0 for them
# (`scores.exp_shift`) so they end with l = 0, output 0 and lse -inf, never NaN. Extra memory:
# one chunk of scores plus the (B, H, L) statistics, i.e. linear in L.
# ---------------------------------------------------------------------------------------------


def _fwd(st: Setup, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """q (B, H, L, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv) -> (out (B, H, L, Dv) in q's dtype,
    lse (B, H, L) in the accumulation dtype).

    fp16/bf16 rows of several chunks on the fused kernel run it in float32: it returns each
    chunk's output in its inputs' dtype, and rounding each share to bf16 before the merge
    loses what the merge in fp32 keeps (one row's shares may be large and cancel)."""
    G, Dv, dtype = st.G, v.shape[-1], q.dtype
    if st.fused and dtype in (torch.float16, torch.bfloat16) and any(
            len(chunks) > 1 for _, _, chunks in st.plan.rows):
        q, k, v = (x.to(torch.float32) for x in (q, k, v))  # O((L + S)·D) for O(L·S·D)
    q5 = q.reshape(st.B, st.Hkv, G, st.L, q.shape[-1])  # (B, H, L, D) -> (B, Hkv, G, L, D)
    out = torch.empty(st.B, st.Hkv, G, st.L, Dv, dtype=dtype, device=q.device)
    lse = torch.empty(st.B, st.Hkv, G, st.L, dtype=st.acc, device=q.device)
    rows = _fused_fwd_rows if st.fused else _pure_fwd_rows
    gen = generator(st, q.device)
    for q0, q1, chunks in st.plan.rows:  # the blocks tile 0..L: each row is written once
        if chunks:
            o, lb = rows(st, q5, k, v, q0, q1, chunks, gen)  # (B, Hkv, G, bq, Dv), (.., G, bq)
            out[:, :, :, q0:q1] = o
            lse[:, :, :, q0:q1] = lb
        else:  # every pair masked: output 0 and lse -inf
            out[:, :, :, q0:q1] = 0
            lse[:, :, :, q0:q1] = float("-inf")
    out = out.view(st.B, st.Hkv * G, st.L, Dv)  # (B, Hkv, G, L, Dv) -> (B, H, L, Dv)
    return out, lse.view(st.B, st.Hkv * G, st.L)  # (B, Hkv, G, L) -> (B, H, L)


def _pure_fwd_rows(st: Setup, q5, k, v, q0, q1, chunks, gen):
    """Online softmax over one row block's chunks with plain PyTorch ops.

    Returns (out (B, Hkv, G, bq, Dv), lse (B, Hkv, G, bq)), both in the accumulation dtype."""
    N, Dv, bq = st.B * st.Hkv, v.shape[-1], q1 - q0
    k3 = k.reshape(N, st.S, -1)  # (B, Hkv, S, D) -> (N, S, D)
    v3 = v.reshape(N, st.S, Dv)  # (B, Hkv, S, Dv) -> (N, S, Dv)
    qb = q_rows(st, q5, q0, q1)  # (N, G·bq, D)
    m = torch.full((N, qb.shape[1], 1), float("-inf"), dtype=st.acc, device=qb.device)
    l = torch.zeros_like(m)  # (N, G·bq, 1)
    acc = torch.zeros(N, qb.shape[1], Dv, dtype=st.acc, device=qb.device)  # (N, G·bq, Dv)
    for ch in chunks:
        kc = k3[:, ch.k0:ch.k1].to(st.acc)  # (N, ck, D)
        vc = v3[:, ch.k0:ch.k1].to(st.acc)  # (N, ck, Dv)
        allowed = chunk_allowed(st, q0, q1, ch, qb.device) if ch.masked else None
        if allowed is not None and not st.finite:  # 0·NaN is NaN: zero unattended columns
            vc = torch.where(alive_columns(st, allowed), vc, 0.0)
        s, _, _ = chunk_scores(st, qb, kc, q0, q1, ch, allowed)  # (N, G·bq, ck)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (N, G·bq, 1)
        shift = scores.exp_shift(m_new)
        p = torch.exp(s - shift)  # (N, G·bq, ck)
        alpha = torch.exp(m - shift)  # 0 on the first chunk
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        if gen is not None:
            p = p * dropout_keep(st, gen, p.shape, qb.device)
        acc = torch.baddbmm(acc * alpha, p, vc)  # (N, G·bq, ck) @ (N, ck, Dv) -> (N, G·bq, Dv)
        m = m_new
    out = acc / torch.where(l > 0, l, 1.0)
    lse = scores.exp_shift(m) + torch.log(l)  # (N, G·bq, 1); log(0) = -inf: nothing to attend
    out = out.view(st.B, st.Hkv, st.G, bq, Dv)  # (N, G·bq, Dv) -> (B, Hkv, G, bq, Dv)
    return out, lse.view(st.B, st.Hkv, st.G, bq)  # (N, G·bq, 1) -> (B, Hkv, G, bq)


def _fused_fwd_rows(st: Setup, q5, k, v, q0, q1, chunks, gen=None):
    """(out (B, Hkv, G, bq, Dv), lse (B, Hkv, G, bq) fp32|fp64) of one row block on the fused
    kernel; out is in q's dtype for one chunk, in the lse's dtype when chunks were merged. No
    dropout on this path (`fused_cpu.applies`), so `gen` is always None."""
    qb = stacked_rows(st, q5, q0, q1)  # (B, Hkv, G·bq, D)
    inputs = (fused_chunk(st, k, v, q0, q1, ch, q5.dtype) for ch in chunks)
    out, lse = fused.forward(qb, inputs, scale=st.scale)  # (B, Hkv, G·bq, Dv), (B, Hkv, G·bq)
    bq = q1 - q0
    out = out.view(st.B, st.Hkv, st.G, bq, -1)  # (B, Hkv, G·bq, Dv) -> (B, Hkv, G, bq, Dv)
    return out, lse.view(st.B, st.Hkv, st.G, bq)  # (B, Hkv, G·bq) -> (B, Hkv, G, bq)


# ---------------------------------------------------------------------------------------------
# Backward: recompute each chunk's weights from the saved lse, never store them
#
# With P = exp(s - lse) (the softmax weights), Z the dropout multiplier and dO the output
# gradient:
#
#     dV = (P·Z)ᵀ @ dO;   dP = (dO @ Vᵀ)·Z;   dS = P · (dP - δ),  δ = rowsum(dO · out) - dlse
#     dQ = scale · dS @ K;  dK = scale · dSᵀ @ Q
#
# (rowsum(dO · out) equals rowsum(P·dP) because out = (P·Z) @ V; dlse, the gradient of the
# returned lse = log Σ exp(s), adds P·dlse to dS since d lse_i / d s_ij = P_ij.) Softcap
# multiplies dS by 1 - tanh². out and lse may be global: the rows' output and lse over more keys
# than this call's (a context-parallel block), and the result is then this call's keys' share.
# Rows with lse = -inf (nothing to attend) get P = 0 and so gradient 0 (`scores.lse_for_exp`).
# dK and dV accumulate in the accumulation dtype over (B, Hkv, S, D) buffers; per query block
# only one chunk of scores is alive. Both row paths return the block's dQ and add its shares of
# dK and dV.
# ---------------------------------------------------------------------------------------------


def _bwd(st: Setup, q, k, v, out, lse, dout, dlse=None):
    """Gradients (dq, dk, dv) in the inputs' dtypes; q, k, v, out, lse as `_fwd`'s, dout as out,
    dlse as lse or None (zero). The gradients of the score_mod's captured tensors are summed
    into `st.captured_grads` (give a Setup with a list of None there).

    fp16/bf16 on the fused kernel run it in float32: its gradients come back in its inputs'
    dtype, and each chunk's share of dq (and each row block's of dk, dv) rounded to bf16 before
    the sum loses what accumulating in fp32 keeps (O((L + S)·D) conversions for O(L·S·D) work).
    """
    dtypes = (q.dtype, k.dtype, v.dtype)
    if st.fused and q.dtype in (torch.float16, torch.bfloat16):
        q, k, v, out, dout = (x.to(torch.float32) for x in (q, k, v, out, dout))
    extra = 0
    if dlse is not None and st.fused:  # the fused kernel takes dlse as one more column
        q, k, v, out, dout, extra = fused_cpu.with_lse_grad(q, k, v, out, dout, dlse)
        dlse = None
    G, D, Dv = st.G, q.shape[-1], v.shape[-1]
    q5 = q.reshape(st.B, st.Hkv, G, st.L, D)  # (B, H, L, D) -> (B, Hkv, G, L, D)
    out5 = out.reshape(st.B, st.Hkv, G, st.L, Dv)  # (B, H, L, Dv) -> (B, Hkv, G, L, Dv)
    do5 = dout.reshape(st.B, st.Hkv, G, st.L, Dv)  # (B, H, L, Dv) -> (B, Hkv, G, L, Dv)
    lse5 = lse.reshape(st.B, st.Hkv, G, st.L)  # (B, H, L) -> (B, Hkv, G, L)
    dlse5 = None if dlse is None else dlse.reshape(st.B, st.Hkv, G, st.L)  # like lse5
    dq = torch.empty(st.B, st.Hkv, G, st.L, D, dtype=q.dtype, device=q.device)
    dk = torch.zeros(st.B, st.Hkv, st.S, D, dtype=st.acc, device=q.device)  # accumulated into
    dv = torch.zeros(st.B, st.Hkv, st.S, Dv, dtype=st.acc, device=q.device)  # accumulated into
    rows = _fused_bwd_rows if st.fused else _pure_bwd_rows
    gen = generator(st, q.device)  # replays the forward's dropout, in the same order
    for q0, q1, chunks in st.plan.rows:  # the blocks tile 0..L: each dq row is written once
        if chunks:
            g = rows(st, q5, k, v, out5, lse5, do5, q0, q1, chunks, dk, dv, gen, dlse5)
            dq[:, :, :, q0:q1] = g  # (B, Hkv, G, bq, D)
        else:  # nothing attended: no gradient
            dq[:, :, :, q0:q1] = 0
    dq = dq.view(q.shape).to(dtypes[0])  # (B, Hkv, G, L, D) -> (B, H, L, D)
    dk, dv = dk.view(k.shape).to(dtypes[1]), dv.view(v.shape).to(dtypes[2])  # (B, Hkv, S, ·)
    if extra:  # drop the lse columns: (.., D + extra) -> (.., D)
        dq, dk, dv = (x[..., :-extra] for x in (dq, dk, dv))
    return dq, dk, dv


def _pure_bwd_rows(st: Setup, q5, k, v, out5, lse5, do5, q0, q1, chunks, dk, dv, gen,
                   dlse5=None):
    """dq rows (B, Hkv, G, bq, D) in the accumulation dtype of one row block, with plain PyTorch
    ops; adds this block's shares to dk (B, Hkv, S, D) and dv (B, Hkv, S, Dv)."""
    N, G, bq, D, Dv = st.B * st.Hkv, st.G, q1 - q0, q5.shape[-1], v.shape[-1]
    k3, v3 = k.reshape(N, st.S, D), v.reshape(N, st.S, Dv)  # (B, Hkv, S, ·) -> (N, S, ·)
    dk3, dv3 = dk.view(N, st.S, D), dv.view(N, st.S, Dv)  # views: the adds below land in dk, dv
    qb = q_rows(st, q5, q0, q1)  # (N, G·bq, D)
    dob = do5[:, :, :, q0:q1].to(st.acc).reshape(N, G * bq, Dv)  # (B, Hkv, G, bq, Dv) -> 3-D
    ob = out5[:, :, :, q0:q1].to(st.acc).reshape(N, G * bq, Dv)  # -> (N, G·bq, Dv)
    delta = (dob * ob).sum(-1, keepdim=True)  # (N, G·bq, 1): rowsum(dO · out)
    if dlse5 is not None:
        delta = delta - dlse5[:, :, :, q0:q1].to(st.acc).reshape(N, G * bq, 1)  # - dlse
    lse_b = scores.lse_for_exp(lse5[:, :, :, q0:q1]).reshape(N, G * bq, 1)  # (.., bq) -> 3-D
    dqb = torch.zeros(N, G * bq, D, dtype=st.acc, device=qb.device)
    for ch in chunks:
        kc = k3[:, ch.k0:ch.k1].to(st.acc)  # (N, ck, D)
        vc = v3[:, ch.k0:ch.k1].to(st.acc)  # (N, ck, Dv)
        allowed = chunk_allowed(st, q0, q1, ch, qb.device) if ch.masked else None
        if allowed is not None and not st.finite:
            alive = alive_columns(st, allowed)
            kc, vc = torch.where(alive, kc, 0.0), torch.where(alive, vc, 0.0)
        s, t, mod_vjp = chunk_scores(st, qb, kc, q0, q1, ch, allowed, grad=True)
        p = s.sub_(lse_b).exp_()  # the weights, in place of the scores
        dp = torch.bmm(dob, vc.transpose(1, 2))  # (N, G·bq, Dv) @ (N, Dv, ck) -> (N, G·bq, ck)
        pz = p
        if gen is not None:
            z = dropout_keep(st, gen, p.shape, qb.device)
            pz, dp = p * z, dp * z
        dv3[:, ch.k0:ch.k1].baddbmm_(pz.transpose(1, 2), dob)  # (N, ck, G·bq) @ (N, G·bq, Dv)
        ds = dp.sub_(delta).mul_(p)  # (N, G·bq, ck): P · (dP - δ), in place of dP
        if t is not None:
            ds.mul_(t.mul_(t).neg_().add_(1.0))  # d(softcap·tanh(x/softcap))/dx = 1 - tanh²
        if mod_vjp is not None:  # through the score_mod: its Jacobian (elementwise), by autograd
            ds = mod_vjp(ds)
        dqb.baddbmm_(ds, kc)  # (N, G·bq, ck) @ (N, ck, D) -> (N, G·bq, D)
        # (N, ck, G·bq) @ (N, G·bq, D) -> (N, ck, D), times the scale
        dk3[:, ch.k0:ch.k1].baddbmm_(ds.transpose(1, 2), qb, alpha=st.scale)
    return (dqb * st.scale).view(st.B, st.Hkv, G, bq, D)  # (N, G·bq, D) -> 5-D


def _fused_bwd_rows(st: Setup, q5, k, v, out5, lse5, do5, q0, q1, chunks, dk, dv, gen=None,
                    dlse5=None):
    """dq rows (B, Hkv, G, bq, D) in the accumulation dtype, on the fused kernel; adds this
    block's shares to dk (B, Hkv, S, D) and dv (B, Hkv, S, Dv). An lse gradient arrives folded
    into the inputs' extra columns (`fused_cpu.with_lse_grad`, by `_bwd`), so dlse5 is always
    None; no dropout on this path, so `gen` is always None."""
    qb = stacked_rows(st, q5, q0, q1)  # (B, Hkv, G·bq, D)
    ob, dob = stacked_rows(st, out5, q0, q1), stacked_rows(st, do5, q0, q1)  # (B, Hkv, G·bq, Dv)
    lb = lse5[:, :, :, q0:q1].reshape(st.B, st.Hkv, -1)  # (B, Hkv, G, bq) -> (B, Hkv, G·bq)
    inputs = ((ch, *fused_chunk(st, k, v, q0, q1, ch, q5.dtype)[:3]) for ch in chunks)
    dq = fused.backward(dob, qb, ob, lb, inputs, dk, dv, scale=st.scale)  # (B, Hkv, G·bq, D)
    return dq.view(st.B, st.Hkv, st.G, q1 - q0, -1)  # (B, Hkv, G·bq, D) -> (B, Hkv, G, bq, D)


# ---------------------------------------------------------------------------------------------
# The autograd Function and the entry points
# ---------------------------------------------------------------------------------------------


class TiledAttention(torch.autograd.Function):
    """(q, k, v, st, *captured) -> (out, lse); `captured` are st.captured, the score_mod's
    tensors that need a gradient, given as inputs so autograd asks for their gradients (the
    score_mod reads them itself).

    The tensors the backward reads (q, k, v, out, lse, SDPA's attn_mask and the ALiBi slopes)
    are saved with `save_for_backward`, so saved-tensor hooks see them; ctx.st keeps the plan,
    the masks and the chunk masks derived from them (recomputable from the mask objects)."""

    @staticmethod
    def forward(ctx, q, k, v, st: Setup, *captured):
        out, lse = _fwd(st, q, k, v)
        shell = st.shell
        ctx.save_for_backward(q, k, v, out, lse, st.bias, st.slopes, shell.attn_mask,
                              shell.alibi_slopes)
        ctx.st = dataclasses.replace(st, bias=None, slopes=None, shell=dataclasses.replace(
            shell, attn_mask=None, alibi_slopes=None))
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, bias, slopes, attn_mask, alibi = ctx.saved_tensors
        st = dataclasses.replace(ctx.st, bias=bias, slopes=slopes, shell=dataclasses.replace(
            ctx.st.shell, attn_mask=attn_mask, alibi_slopes=alibi))
        if second_order.wanted():  # create_graph=True: gradients that are differentiable again
            return _second_order(st, q, k, v, dout, dlse)
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        st.captured_grads = [None] * len(st.captured)
        dq, dk, dv = _bwd(st, q, k, v, out, lse, dout, _nonzero(dlse))
        return dq, dk, dv, None, *st.captured_grads


def _second_order(st: Setup, q, k, v, dout, dlse):
    """The backward's gradients with a graph: this call on the math path, by autograd."""
    p, d = st.shell, st.shell.dims
    second_order.check('backend "tiled"', d.scores_shape, st.acc.itemsize, p.dropout_p)

    def forward(q, k, v):  # (B, H|Hkv, L|S, D|Dv) -> (out (B, H, L, Dv), lse (B, H, L))
        call = dataclasses.replace(p, query=q.reshape(_shape(d, d.H, d.L, d.D)),
                                   key=k.reshape(_shape(d, d.Hkv, d.S, d.D)),
                                   value=v.reshape(_shape(d, d.Hkv, d.S, d.Dv)), memo={})
        out, lse = plain.forward(call)  # (..., H, L, Dv), (..., H, L)
        return out.reshape(*q.shape[:-1], d.Dv), lse.reshape(q.shape[:-1])

    dq, dk, dv, *dcap = second_order.grads(forward, (q, k, v), dout, dlse, st.captured)
    return dq, dk, dv, None, *dcap


def _shape(d, heads: int, n: int, last: int) -> tuple[int, ...]:
    """An input's shape as the call gave it: (..., heads, n, last), or (n, last) for 2-D."""
    return (*d.batch, heads, n, last) if d.ndim > 2 else (n, last)


def _nonzero(dlse: torch.Tensor | None) -> torch.Tensor | None:
    """dlse, or None where it is absent or all zero (the backward then skips its term)."""
    return None if dlse is None or not bool(dlse.any()) else dlse


def forward(p: Problem, need_lse: bool = True, *, fused: bool | None = None):
    """(out (..., H, L, Dv) in the input dtype, lse (..., H, L) in the accumulation dtype).

    fused: run each chunk on PyTorch's fused flash kernel (default: wherever `fused_cpu.applies`)
    or on plain PyTorch ops (False; always available).
    """
    d = p.dims
    if min(p.query.numel(), p.key.numel(), p.value.numel()) == 0:
        return plain.forward(p)  # nothing to tile; the math path has the semantics
    st = make_setup(p, fused=fused_cpu.applies(p) if fused is None else fused)
    q, k, v = _kernel_inputs(p, st)
    out, lse = TiledAttention.apply(q, k, v, st, *st.captured)
    out = out.reshape(*p.query.shape[:-1], d.Dv)  # (B, H, L, Dv) -> (..., H, L, Dv)
    return out, lse.reshape(p.query.shape[:-1])  # (B, H, L) -> (..., H, L)


def _kernel_inputs(p: Problem, st: Setup):
    """q (B, H, L, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv): the batch dims flattened."""
    d = p.dims
    q = p.query.reshape(st.B, d.H, d.L, d.D)  # (..., H, L, D) -> (B, H, L, D)
    k = p.key.reshape(st.B, d.Hkv, d.S, d.D)  # (..., Hkv, S, D) -> (B, Hkv, S, D)
    v = p.value.reshape(st.B, d.Hkv, d.S, d.Dv)  # (..., Hkv, S, Dv) -> (B, Hkv, S, Dv)
    if st.fused:  # the layouts the fused kernel reads right, copied once rather than per chunk
        q, k, v = (fused_cpu.laid_out(x) for x in (q, k, v))
    return q, k, v


def backward(p: Problem, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor,
             dlse: torch.Tensor | None = None, *, fused: bool | None = None):
    """(dq, dk, dv) of the call `p` (no dropout), given its rows' out (..., H, L, Dv) and lse
    (..., H, L) and their gradients dout and dlse (None: zero).

    out and lse may be global: the rows' output and log-sum-exp over a larger key set of which
    p's keys are a part; the result is then p's keys' exact share (dq summed over the parts gives
    the whole dq). Rows with lse -inf get zero gradient. The caller gives k and v without NaN/Inf
    in positions no row of `p` attends (or zeroed there). Grouped heads never copy k or v.

    dq has q's dtype; dk, dv have k's and v's (each part accumulates in the accumulation dtype).
    """
    if p.dropout_p:
        raise AttnlabError("dropout_p: tiled.backward has no dropout to replay; pass 0")
    d = p.dims
    if min(p.query.numel(), p.key.numel(), p.value.numel()) == 0:
        return torch.zeros_like(p.query), torch.zeros_like(p.key), torch.zeros_like(p.value)
    st = make_setup(p, fused=fused_cpu.applies(p) if fused is None else fused)
    q, k, v = _kernel_inputs(p, st)
    rows = (st.B, d.H, d.L)
    out = out.reshape(*rows, d.Dv)  # (..., H, L, Dv) -> (B, H, L, Dv)
    dout = dout.reshape(*rows, d.Dv).contiguous()  # like out
    lse = lse.reshape(rows)  # (..., H, L) -> (B, H, L)
    if dlse is not None:
        dlse = _nonzero(dlse.reshape(rows))  # like lse
    dq, dk, dv = _bwd(st, q, k, v, out, lse, dout, dlse)
    return (dq.reshape(p.query.shape), dk.reshape(p.key.shape),  # (B, H|Hkv, ·, ·) -> (..., ·)
            dv.reshape(p.value.shape))
