"""The tiled kernel's Setup: one call's inputs in the kernel's layout, built once per call.

The forward and the backward both read it: the flattened sizes, the scale and modifiers, the
masks in their tiled form (a structured mask as is; SDPA's `attn_mask` as a 4-D (B|1, H|1, L|1,
S|1) tensor), the plan, and the dropout seed the backward replays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnlab.masks import Mask
from attnlab.ops import captured, scores
from attnlab.ops.nonfinite import all_finite
from attnlab.ops.problem import Problem
from attnlab.ops.tiled.plan import Plan, plan_for


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


def remember(st: Setup, key, value, entries: int) -> None:
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
