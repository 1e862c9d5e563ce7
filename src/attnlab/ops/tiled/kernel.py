"""The tiled kernel, read top to bottom: one call's setup, a chunk's mask and scores, the forward,
the backward, the autograd Function, and the two entry points the rest of attnlab calls.

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
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnlab.errors import AttnlabError
from attnlab.masks import Mask
from attnlab.ops import captured, fused_cpu, plain, scores, second_order
from attnlab.ops.nonfinite import all_finite
from attnlab.ops.problem import Problem
from attnlab.ops.tiled import fused
from attnlab.ops.tiled.plan import Chunk, Plan, plan_for

# ---------------------------------------------------------------------------------------------
# Setup: one call's inputs in the kernel's layout, built once per call
#
# The forward and the backward both read it: the flattened sizes, the scale and modifiers, the
# masks in their tiled form (a structured mask as is; SDPA's `attn_mask` as a 4-D (B|1, H|1, L|1,
# S|1) tensor), the plan, and the dropout seed the backward replays.
# ---------------------------------------------------------------------------------------------


@dataclass
class Setup:
    """Everything needed to (re)compute any chunk of one call."""

    B: int  # all batch dims flattened
    Hkv: int
    G: int  # query heads per key/value head
    L: int
    S: int
    batch: tuple[int, ...]
    scale: float
    acc: torch.dtype
    structured: Mask | None
    bias: torch.Tensor | None  # attn_mask as (B|1, H|1, L|1, S|1), bool or float
    softcap: float | None
    slopes: torch.Tensor | None  # ALiBi slopes as (1, Hkv, G, 1, 1), accumulation dtype
    dropout_p: float
    seed: int
    plan: Plan
    fused: bool  # inner step on PyTorch's fused flash kernel (fused.py) instead of pure ops
    finite: bool  # k and v hold no NaN/Inf: masked key columns need no zeroing
    shift_invariant: bool = False  # the mask depends only on i - j (causal, sliding window)
    score_mod: Callable | None = None  # the call's bound score_mod (plain path only)
    #: tensors the score_mod reads that need a gradient (`ops.captured`): the Function's inputs
    captured: tuple = ()
    #: during a backward: their gradients, summed over the chunks (None: no chunk reached one)
    captured_grads: list | None = None
    #: the call without its q, k, v, for a double backward's recomputation (`second_order`)
    shell: Problem | None = None
    #: chunk masks kept across calls by a mask that offers a store (`FunctionMask.memo`): a mask
    #: function is not shift invariant, so this is its stand-in for `cache`
    memo: dict | None = None
    cache: dict = field(default_factory=dict)  # chunk masks by diagonal offset and shape


def make_setup(p: Problem, fused: bool) -> Setup:
    d = p.dims
    B = 1
    for b in d.batch:
        B *= b
    acc = scores.accum_dtype(p.query.dtype)
    slopes = p.alibi_slopes
    if slopes is not None:  # broadcast over the 5-D scores (B, Hkv, G, bq, ck)
        slopes = slopes.detach().to(p.query.device, acc)
        slopes = slopes.reshape(1, d.Hkv, d.groups, 1, 1)  # (H,) -> (1, Hkv, G, 1, 1)
    seed = int(torch.randint(0, 2**62, (1,)).item()) if p.dropout_p > 0 else 0
    return Setup(
        B=B, Hkv=d.Hkv, G=d.groups, L=d.L, S=d.S, batch=d.batch, scale=p.scale, acc=acc,
        structured=p.structured, bias=_bias4(p), softcap=p.softcap,
        slopes=slopes, dropout_p=p.dropout_p, seed=seed, plan=plan_for(p, fused),
        fused=fused,
        finite=p.finite or (all_finite(p.key) and all_finite(p.value)),
        shift_invariant=(p.attn_mask is None and p.structured is not None
                         and p.structured.shift_invariant),
        score_mod=p.score_mod,
        captured=captured.of(p),
        shell=dataclasses.replace(p, query=None, key=None, value=None, memo={}),
        memo=_memo(p, fused),
    )


#: most mask entries one mask's store keeps across calls (chunk biases in the input dtype)
MEMO_ENTRIES = 1 << 24


def _memo(p: Problem, fused: bool) -> dict | None:
    """The structured mask's store for this shape, when it offers one and masks alone."""
    store = getattr(p.structured, "memo", None)
    if p.attn_mask is not None or not callable(store):
        return None
    d = p.dims
    return store(("tiled.chunks", d.L, d.S, d.batch, d.Hkv, d.groups, str(p.query.dtype),
                  str(p.query.device), fused))


def _remember(st: Setup, key, value, entries: int) -> None:
    """Keep a chunk's mask in the store while it holds fewer than MEMO_ENTRIES entries."""
    used = st.memo.get("entries", 0)
    if used + entries <= MEMO_ENTRIES:
        st.memo[key] = value
        st.memo["entries"] = used + entries


def _bias4(p: Problem) -> torch.Tensor | None:
    """SDPA's attn_mask as (B|1, H|1, L|1, S|1) with the batch dims flattened."""
    m = p.attn_mask
    if m is None:
        return None
    n = len(p.dims.scores_shape)  # m has at most n dims: the Problem dropped any extra ones
    m = m.reshape((1,) * (n - m.dim()) + tuple(m.shape))  # (..., H|1, L|1, S|1), n dims
    if p.dims.ndim == 2:
        return m[None, None]  # (L|1, S|1) -> (1, 1, L|1, S|1)
    nb = len(p.dims.batch)
    if all(s == 1 for s in m.shape[:nb]):
        return m.reshape(1, *m.shape[nb:])  # (1, ..., 1, H|1, L|1, S|1) -> (1, H|1, L|1, S|1)
    m = m.expand(*p.dims.batch, *m.shape[nb:])  # (..., H|1, L|1, S|1) -> (*batch, ...)
    return m.reshape(-1, *m.shape[nb:])  # -> (B, H|1, L|1, S|1), batch flattened like q's


def dropout_keep(st: Setup, gen: torch.Generator, shape, device) -> torch.Tensor:
    """The survivors' multiplier (0 or 1/(1-p)); the backward replays the same generator."""
    keep = torch.rand(shape, generator=gen, device=device) >= st.dropout_p
    if st.dropout_p >= 1.0:  # every weight dropped (0/0 otherwise)
        return keep.to(st.acc)
    return keep.to(st.acc) / (1.0 - st.dropout_p)


def generator(st: Setup, device) -> torch.Generator | None:
    """The dropout generator of one pass (None without dropout); the backward gets the same."""
    if st.dropout_p == 0:
        return None
    return torch.Generator(device=device).manual_seed(st.seed)


# ---------------------------------------------------------------------------------------------
# One chunk: its mask and scores, as the forward and the backward both recompute them
#
# A chunk is (a block of bq query rows) × (a contiguous range of ck key columns). Its scores are
# one batched matmul over N = B·Hkv, with the G query heads that share a key/value head stacked
# along the rows, so grouped-query attention never copies k or v:
#
#     s = (q @ kᵀ) · scale   # (N, G·bq, D) @ (N, D, ck) -> (N, G·bq, ck)
#
# then softcap, ALiBi, the float `attn_mask` bias and the bool masks (only on chunks the plan
# marks as masked), all through the one score pipeline (`ops.scores`) on the 5-D view
# (B, Hkv, G, bq, ck). Everything is fp32 for fp16/bf16 inputs. The fused path gets the same
# mask as a float bias (`fused_chunk`).
# ---------------------------------------------------------------------------------------------


def _flat_batch(t: torch.Tensor, st: Setup) -> torch.Tensor:
    """A mask's (Bm, ...) with Bm in {1, batch[-1]} as (1 | B, ...) over the flattened batch."""
    if t.shape[0] == 1 or len(st.batch) <= 1:
        return t
    t = t.expand(*st.batch, *t.shape[1:])  # (Bm, Hm, bq, ck) -> (*batch, Hm, bq, ck)
    return t.reshape(-1, *t.shape[len(st.batch):])  # -> (B, Hm, bq, ck)


def bias_chunk(st: Setup, q0: int, q1: int, ch: Chunk) -> torch.Tensor:
    """SDPA's attn_mask for rows q0:q1 and the chunk's keys (dims of size 1 stay broadcast)."""
    b = st.bias
    b = b[:, :, q0:q1] if b.shape[2] > 1 else b
    return b[:, :, :, ch.k0:ch.k1] if b.shape[3] > 1 else b  # (B|1, H|1, bq|1, ck|1)


def chunk_allowed(st: Setup, q0: int, q1: int, ch: Chunk, device) -> torch.Tensor | None:
    """bool (B|1, Hkv|1, G|1, bq, ck): which pairs of this chunk may attend (None = all)."""
    allowed = None
    key = ("allowed", q0, q1, ch.k0, ch.k1)
    if st.memo is not None and key in st.memo:
        return st.memo[key]
    if st.structured is not None:
        rows = torch.arange(q0, q1, device=device)
        cols = torch.arange(ch.k0, ch.k1, device=device)
        allowed = _flat_batch(st.structured.block(rows, cols, st.L, st.S), st)  # (Bm, Hm, bq, ck)
        if st.memo is not None:  # the mask alone: kept for the next call of this shape
            allowed = scores.heads5(allowed, st.Hkv, st.G)
            _remember(st, key, allowed, allowed.numel())
            return allowed
    if st.bias is not None:
        b = bias_chunk(st, q0, q1, ch)
        b = b if b.dtype == torch.bool else b != float("-inf")
        allowed = b if allowed is None else allowed & b
    return None if allowed is None else scores.heads5(allowed, st.Hkv, st.G)


def alive_columns(st: Setup, allowed: torch.Tensor) -> torch.Tensor:
    """bool (N, ck, 1): key columns some row of this chunk may attend, per (batch, kv head).

    A column no row attends gets weight exactly 0, but 0 · NaN is NaN: its k and v are zeroed.
    """
    a = allowed.any(dim=-2).any(dim=2)  # (B|1, Hkv|1, G|1, bq, ck) -> (B|1, Hkv|1, ck)
    a = a.expand(st.B, st.Hkv, a.shape[-1])  # (B|1, Hkv|1, ck) -> (B, Hkv, ck)
    return a.reshape(st.B * st.Hkv, -1, 1)  # (B, Hkv, ck) -> (N, ck, 1)


def chunk_scores(st: Setup, qb: torch.Tensor, k: torch.Tensor, q0: int, q1: int, ch: Chunk,
                 allowed: torch.Tensor | None, grad: bool = False):
    """(s (N, G·bq, ck) scores, t = tanh(raw/softcap) or None for the softcap gradient,
    mod_vjp: ds -> ds through the score_mod, or None without one or without `grad`).

    qb: (N, G·bq, D) query rows and k: (N, ck, D) the chunk's keys, both in the accumulation dtype.
    """
    N, bq, ck = qb.shape[0], q1 - q0, ch.k1 - ch.k0
    s = scores.product(qb, k, st.scale)  # (N, G·bq, D) @ (N, D, ck) -> (N, G·bq, ck)
    mod_vjp = None
    if st.score_mod is not None:
        s, mod_vjp = _score_mod(st, s, q0, q1, ch, grad)
    rows = cols = None
    if st.slopes is not None:  # ALiBi needs the global positions i and j
        rows = torch.arange(q0, q1, device=s.device)
        cols = torch.arange(ch.k0, ch.k1, device=s.device)
    bias = None
    if st.bias is not None and st.bias.dtype != torch.bool:
        bias = scores.heads5(bias_chunk(st, q0, q1, ch), st.Hkv, st.G)  # (B|1, Hkv|1, G|1, bq, ck)
    s5, t = scores.modify(s.view(st.B, st.Hkv, st.G, bq, ck),  # (N, G·bq, ck) -> 5-D view
                          softcap=st.softcap, slopes=st.slopes, rows=rows, cols=cols, bias=bias,
                          allowed=allowed)
    s = s5.view(N, st.G * bq, ck)  # (B, Hkv, G, bq, ck) -> (N, G·bq, ck)
    return s, None if t is None else t.view(N, st.G * bq, ck), mod_vjp  # 5-D -> (N, G·bq, ck)


def _score_mod(st: Setup, s: torch.Tensor, q0: int, q1: int, ch: Chunk, grad: bool):
    """(score_mod(s) (N, G·bq, ck), its vector-Jacobian product or None) for one chunk; the
    heads of a key/value head are stacked along the rows, so (N, G·bq, ck) is (B, H, bq, ck)."""
    N, bq, ck = s.shape[0], q1 - q0, ch.k1 - ch.k0
    rows = torch.arange(q0, q1, device=s.device)
    cols = torch.arange(ch.k0, ch.k1, device=s.device)
    s4 = s.view(st.B, st.Hkv * st.G, bq, ck)  # (N, G·bq, ck) -> (B, H, bq, ck)
    if not grad:
        with torch.no_grad():
            return scores.apply_score_mod(st.score_mod, s4, rows, cols).view(N, -1, ck), None
    raw = s4.detach().requires_grad_(True)
    with torch.enable_grad():
        out = scores.apply_score_mod(st.score_mod, raw, rows, cols)  # (B, H, bq, ck)

    def vjp(ds: torch.Tensor) -> torch.Tensor:  # d(score_mod)ᵀ · ds, (N, G·bq, ck)
        g, *extra = torch.autograd.grad(out, (raw, *st.captured), ds.view_as(out),
                                        allow_unused=True)
        for i, e in enumerate(extra):  # the captured tensors' share of this chunk
            if e is not None:
                acc = st.captured_grads
                acc[i] = e if acc[i] is None else acc[i] + e
        return g.view(N, -1, ck)

    # a copy: the caller turns the scores into weights in place, and out's backward may read out
    return out.detach().clone().view(N, -1, ck), vjp


def fused_chunk(st: Setup, k, v, q0: int, q1: int, ch: Chunk, dtype):
    """The fused kernel's inputs for one chunk: (kc, vc (B, Hkv, ck, D|Dv) zeroed where no row
    attends, float bias (B|1, Hkv|1, G·bq, ck) or None, row liveness (B|1, Hkv|1, G·bq) or None)."""
    kc, vc = k[:, :, ch.k0:ch.k1], v[:, :, ch.k0:ch.k1]  # (B, Hkv, ck, D)
    if not ch.masked:
        return kc, vc, None, None
    key = (q0 - ch.k0, q1 - q0, ch.k1 - ch.k0)
    if st.shift_invariant and st.finite and key in st.cache:
        return kc, vc, *st.cache[key]  # the same diagonal offset has the same mask
    mkey = ("fused", q0, q1, ch.k0, ch.k1)
    if st.memo is not None and st.finite and mkey in st.memo:
        return kc, vc, *st.memo[mkey]  # this chunk of this mask, kept from an earlier call
    allowed = chunk_allowed(st, q0, q1, ch, k.device)  # (B|1, Hkv|1, G|1, bq, ck)
    if not st.finite:  # 0·NaN is NaN: zero the columns no row of this chunk attends
        alive = alive_columns(st, allowed).view(st.B, st.Hkv, -1, 1)  # (N, ck, 1) -> 4-D
        kc, vc = torch.where(alive, kc, 0), torch.where(alive, vc, 0)
    zero = torch.zeros((), dtype=dtype, device=k.device)
    bias = torch.where(allowed, zero, float("-inf"))  # (B|1, Hkv|1, G|1, bq, ck)
    if st.bias is not None and st.bias.dtype != torch.bool:
        bias = bias + scores.heads5(bias_chunk(st, q0, q1, ch), st.Hkv, st.G).to(dtype)
    (Bb, Hb), bq, ck = bias.shape[:2], q1 - q0, ch.k1 - ch.k0  # a mask may broadcast rows/cols
    bias = bias.expand(Bb, Hb, st.G, bq, ck).reshape(Bb, Hb, st.G * bq, ck)  # (.., G·bq, ck)
    rows = allowed.any(-1)  # (B|1, Hkv|1, G|1, bq|1)
    rows = rows.expand(*rows.shape[:2], st.G, bq)  # -> (B|1, Hkv|1, G, bq)
    row_alive = rows.reshape(*rows.shape[:2], st.G * bq)  # -> (B|1, Hkv|1, G·bq), kernel rows
    if st.shift_invariant:
        st.cache[key] = (bias, row_alive)
    elif st.memo is not None:
        _remember(st, mkey, (bias, row_alive), bias.numel())
    return kc, vc, bias, row_alive


def q_rows(st: Setup, q5: torch.Tensor, q0: int, q1: int) -> torch.Tensor:
    """(B, Hkv, G, L, D) rows q0:q1 as (N, G·bq, D) in the accumulation dtype."""
    qb = q5[:, :, :, q0:q1].to(st.acc)  # (B, Hkv, G, bq, D)
    return qb.reshape(st.B * st.Hkv, st.G * (q1 - q0), -1)  # -> (N, G·bq, D)


def stacked_rows(st: Setup, x5: torch.Tensor, q0: int, q1: int) -> torch.Tensor:
    """(B, Hkv, G, L, E) rows q0:q1 as (B, Hkv, G·bq, E), the fused kernel's 4-D rows; a view
    when G = 1."""
    return x5[:, :, :, q0:q1].reshape(st.B, st.Hkv, st.G * (q1 - q0), x5.shape[-1])  # stack G


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
