"""Backend "flex": torch's FlexAttention, compiled, fed a BlockMask built from attnlab's own tiles.

attnlab's masks already classify (query-block, key-block) tiles as EMPTY / PARTIAL / FULL on the
call's device (`Mask.tiles`); those classes become FlexAttention's BlockMask directly
(`BlockMask.from_kv_blocks`): EMPTY tiles are skipped, FULL tiles run without the mask, PARTIAL
tiles evaluate the mask's `mask_mod`: each mask kind says how Flex sees it (`Mask.mask_mod`: the
user's function for `from_function`, comparisons for causal and windows, loads of lengths, ids,
per-row intervals or bits for the others, `&`, `|`, `~` combining their parts). Everything else
of the call becomes one score_mod, in the order of attnlab's score pipeline (`ops.scores`): the
user's score_mod (fed float32 scores for fp16/bf16 inputs, its result checked), softcap, ALiBi,
SDPA's float attn_mask (a row of it wholly below -1e30, HF's finfo.min padding, moved up inside
the score_mod and its lse moved back, so the lse does not overflow in Flex's log2 units). A
bool attn_mask joins the mask.

Where it runs: CUDA (the kernel "auto" picks for structured masks, mask functions and score_mods
there; forward and backward, lse), and CPU (torch compiles the forward only: no backward, and the
lse comes from torch's eager, unfused Flex; "auto" never picks it on CPU). torch.compile is set up
once per process and reused; the first call of each shape and mask pays the compile.

Caution: no dropout (FlexAttention has none); in a BlockMask, batch and heads the mask does not
depend on are broadcast (size 1), as create_block_mask(B=None, H=None) makes them. The float
attn_mask's row shift is taken over the row's finite entries, masked keys included: a row whose
float mask is below -2.4e38 on every key a structured mask allows but not on one it masks still
gets Flex's lse of -inf (HF's masks, one float tensor holding everything, never do this).
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
import weakref

import torch

from attnlab.errors import AttnlabError
from attnlab.masks import FULL, PARTIAL, Mask, from_dense
from attnlab.ops import captured, second_order
from attnlab.ops.problem import Problem

#: FlexAttention's tile: the BlockMask's query and key block size
BLOCK = 128
#: per mask object: its BlockMasks by (L, S, device), so a mask reused across layers and steps is
#: classified once (entries die with the mask)
_BLOCK_MASKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def available() -> bool:
    """torch ships FlexAttention (torch >= 2.5)."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def compiled() -> bool:
    """Run through torch.compile (default); ATTNLAB_FLEX_COMPILE=0 runs torch's eager Flex,
    which materialises the scores (for debugging mask/score mods, and the quick tests)."""
    return os.environ.get("ATTNLAB_FLEX_COMPILE", "1") != "0"


@functools.lru_cache(maxsize=2)
def _kernel(compile_it: bool):
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False) if compile_it else flex_attention


def why_not(p: Problem, need_lse: bool = False) -> str | None:
    """Why FlexAttention cannot run this call (None: it can)."""
    if not available():
        return 'backend: "flex" needs torch >= 2.5 (torch.nn.attention.flex_attention)'
    if p.dropout_p > 0:
        return ('dropout_p: backend "flex" has no dropout (FlexAttention has none); '
                'pass dropout_p=0 or use backend="tiled"')
    grad = torch.is_grad_enabled() and (
        any(x.requires_grad for x in (p.query, p.key, p.value)) or bool(captured.of(p)))
    if p.query.device.type == "cpu" and grad:
        return ('backend: "flex" on CPU has no backward (torch compiles FlexAttention '
                'for inference only there); use backend="interval" or "tiled" to train on CPU')
    return None


def forward(p: Problem, need_lse: bool):
    """(out (..., H, L, Dv) in the input dtype, lse (..., H, L) float32 or None)."""
    why = why_not(p, need_lse)
    if why is not None:
        raise AttnlabError(why)
    d, dev = p.dims, p.query.device
    B = 1
    for n in d.batch:
        B *= n
    q = p.query.reshape(B, d.H, d.L, d.D)  # (..., H, L, D) -> (B, H, L, D)
    k = p.key.reshape(B, d.Hkv, d.S, d.D)  # (..., Hkv, S, D) -> (B, Hkv, S, D)
    v = p.value.reshape(B, d.Hkv, d.S, d.Dv)  # (..., Hkv, S, Dv) -> (B, Hkv, S, Dv)
    mask = _mask_of(p)
    bm = None if mask is None else block_mask(mask, d.L, d.S, dev)
    # torch compiles Flex on CPU for inference without an lse: an lse there comes from eager Flex
    fused = compiled() and not (dev.type == "cpu" and need_lse)
    bias, shift = _bias_of(p)
    sm = score_mod_of(p, B, bias, shift)
    check_score_mod(sm, dev)
    with warnings.catch_warnings():  # eager Flex warns that it is unfused: we chose it
        warnings.filterwarnings("ignore", message=".*without torch.compile")
        out, lse = run_kernel(_kernel(fused), q, k, v, need_lse, score_mod=sm,
                              block_mask=bm, scale=p.scale, enable_gqa=d.groups > 1)
    out = out.reshape(*p.query.shape[:-1], d.Dv)  # (B, H, L, Dv) -> (..., H, L, Dv)
    if need_lse:
        if shift is not None:  # rows moved down in the score_mod, moved back (B|1, H|1, L|1, 1)
            lse = lse + shift[..., 0].to(lse.dtype)
        lse = lse.reshape(p.query.shape[:-1])  # (B, H, L) -> (..., H, L)
    return second_order.no_second_order('backend "flex"', out, lse)  # its backward: no graph


def run_kernel(fn, q, k, v, need_lse: bool, **kw):
    """(out, lse or None) from FlexAttention `fn`: the one place that calls the kernel (tests
    replace it to walk the device path on tensors no kernel can run on)."""
    if not need_lse:
        return fn(q, k, v, **kw), None
    from torch.nn.attention.flex_attention import AuxRequest

    out, aux = fn(q, k, v, return_aux=AuxRequest(lse=True), **kw)
    return out, aux.lse


def _mask_of(p: Problem) -> Mask | None:
    """The call's structured mask and bool attn_mask as one attnlab Mask (None: no mask)."""
    mask = p.structured
    m = p.attn_mask
    if m is not None and m.dtype == torch.bool:
        d = p.dims
        m4 = _bias4(m, d)  # (B|1, H|1, L|1, S|1)
        dense = from_dense(m4.expand(*m4.shape[:2], d.L, d.S))
        mask = dense if mask is None else mask & dense
    return mask


def _bias4(m: torch.Tensor, d) -> torch.Tensor:
    """SDPA's attn_mask (..., H|1, L|1, S|1) as (B|1, H|1, L|1, S|1), batch dims flattened."""
    n = len(d.scores_shape)
    m = m.reshape((1,) * (n - m.dim()) + tuple(m.shape))  # n dims
    if d.ndim == 2:
        return m[None, None]  # (L|1, S|1) -> (1, 1, L|1, S|1)
    nb = len(d.batch)
    if all(s == 1 for s in m.shape[:nb]):
        return m.reshape(1, *m.shape[nb:])  # (1, .., 1, H|1, L|1, S|1) -> (1, H|1, L|1, S|1)
    m = m.expand(*d.batch, *m.shape[nb:])
    return m.reshape(-1, *m.shape[nb:])  # (*batch, H|1, L|1, S|1) -> (B, H|1, L|1, S|1)


def block_mask(mask: Mask, L: int, S: int, device):
    """FlexAttention's BlockMask from the mask's own tile classes on `device` (no host sync:
    counts and index lists come from sums and a stable argsort of the classes)."""
    from torch.nn.attention.flex_attention import BlockMask

    per = _BLOCK_MASKS.setdefault(mask, {})
    key = (L, S, str(device))
    if key not in per:
        t = mask.tiles(L, S, BLOCK, BLOCK, device=device)  # (Bm, Hm, nQ, nK) int8
        partial, full = _kv_blocks(t == PARTIAL), _kv_blocks(t == FULL)
        per[key] = BlockMask.from_kv_blocks(*partial, *full, BLOCK_SIZE=BLOCK,
                                            mask_mod=mask_mod_of(mask, L, S, device),
                                            seq_lengths=(L, S))
    return per[key]


def _kv_blocks(sel: torch.Tensor):
    """(counts (Bm, Hm, nQ) int32, indices (Bm, Hm, nQ, nK) int32): the selected key blocks of
    each query block first, in ascending order."""
    num = sel.sum(-1, dtype=torch.int32)  # (Bm, Hm, nQ)
    idx = torch.argsort((~sel).to(torch.uint8), dim=-1, stable=True)  # selected first
    return num, idx.to(torch.int32)


def mask_mod_of(mask: Mask, L: int, S: int, device=None):
    """The mask as FlexAttention's mask_mod(b, h, q_idx, kv_idx): each kind says how Flex sees
    it (`Mask.mask_mod`, pointwise, as compiled Flex lowers it into its kernel)."""
    return mask.mask_mod(L, S, device)


def score_mod_of(p: Problem, B: int, bias=None, shift=None):
    """One score_mod with the user's, softcap, ALiBi and a float attn_mask, in the pipeline's
    order; None when the call has none of them. The user's sees float32 scores for fp16/bf16
    inputs, as every other backend's pipeline gives it (so a table it casts with
    `.to(score.dtype)` keeps its precision), and must return float scores. bias: the float
    attn_mask and its per-row shift as `_bias_of` gives them (default: computed here)."""
    user, cap, slopes = p.score_mod, p.softcap, p.alibi_slopes
    user = getattr(user, "flex_fn", user)  # Flex calls the user's own function on scalars
    if user is not None:
        user = _checked(user)
    if bias is None:
        bias, shift = _bias_of(p)
    if cap is None and slopes is None and bias is None and shift is None:
        return user  # the same object call after call, so torch.compile's guards on it hold
        # and nothing recompiles

    def score_mod(score, b, h, q_idx, kv_idx):
        if user is not None:
            score = user(score, b, h, q_idx, kv_idx)
        if cap is not None:
            score = cap * torch.tanh(score / cap)
        if slopes is not None:
            score = score + slopes[h].to(score.dtype) * (kv_idx - q_idx).to(score.dtype)
        if bias is not None:
            idx = [i if n > 1 else 0 for i, n in zip((b, h, q_idx, kv_idx), bias.shape)]
            score = score + bias[idx[0], idx[1], idx[2], idx[3]].to(score.dtype)
        if shift is not None:  # after the bias, so the sum rounds as on every other backend
            idx = [i if n > 1 else 0 for i, n in zip((b, h, q_idx), shift.shape)]
            score = score - shift[idx[0], idx[1], idx[2], 0].to(score.dtype)
        return score

    return score_mod


#: per user score_mod: its checked float32 form (one object per function, so compiled Flex's
#: guards on it hold call after call)
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _checked(user):
    """user's score_mod called on scores in float32 at least, its result checked to be float
    scores."""
    try:
        return _CHECKED[user]
    except (KeyError, TypeError):
        pass

    def checked(score, b, h, q_idx, kv_idx):
        if score.dtype in (torch.float16, torch.bfloat16):
            score = score.to(torch.float32)
        out = user(score, b, h, q_idx, kv_idx)
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            raise AttnlabError(f"score_mod: must return a float tensor of scores, got "
                               f"{getattr(out, 'dtype', type(out).__name__)}")
        return out

    with contextlib.suppress(TypeError):  # not weakly referenceable: a fresh wrapper each call
        _CHECKED[user] = checked
    return checked


def check_score_mod(fn, device) -> None:
    """Call the score_mod once on one score (broadcast (1, 1, 1, 1) indices, as the other
    backends call it; no value read back), so that a function that returns no float scores, or
    fails, raises one AttnlabError here rather than an error from inside torch's tracing."""
    if fn is None:
        return
    i = torch.zeros(1, 1, 1, 1, dtype=torch.int64, device=device)
    try:
        fn(torch.zeros(1, 1, 1, 1, dtype=torch.float32, device=device), i, i, i, i)
    except AttnlabError:
        raise
    except Exception as e:  # the user's function failed: say so, naming it
        raise AttnlabError(f"score_mod: raised {type(e).__name__} on one score: {e}"[:300]) \
            from None


#: a float attn_mask row whose largest entry is below this is shifted up before Flex sees it:
#: Flex keeps its lse in log2 units, and an lse near finfo.min overflows there to -inf
SHIFT_BELOW = -1e30


def _bias_of(p: Problem):
    """(bias (B|1, H|1, L|1, S|1) or None, per-row shift (B|1, H|1, L|1, 1) or None): the float
    attn_mask, and for each row whose every entry lies below SHIFT_BELOW (HF's finfo.min over a
    whole row) its largest entry, which the score_mod subtracts after adding the bias and the lse
    gets back after the kernel: the softmax is unchanged (a constant per row, the sum rounded as
    on every other backend), and the lse equals theirs (-3.4e38, not -inf)."""
    if p.attn_mask is None or p.attn_mask.dtype == torch.bool:
        return None, None
    bias = _bias4(p.attn_mask, p.dims)  # (B|1, H|1, L|1, S|1)
    finite = torch.where(torch.isfinite(bias), bias, torch.finfo(bias.dtype).min)
    top = finite.amax(-1, keepdim=True)  # (B|1, H|1, L|1, 1)
    shift = torch.where((top < SHIFT_BELOW) & torch.isfinite(bias).any(-1, keepdim=True),
                        top, torch.zeros((), dtype=top.dtype, device=top.device))
    return bias, shift
