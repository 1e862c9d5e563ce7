"""attnlab.flex_attention: torch's flex_attention, forward and backward on a CPU.

    # was: from torch.nn.attention.flex_attention import flex_attention, create_block_mask
    from attnlab.flex import flex_attention, create_block_mask

On CUDA the call goes to torch's compiled flex_attention with the arguments as given. On the CPU
it becomes one `attnlab.attention` call: the BlockMask as a mask (`flex.block`), the score_mod
as a score_mod, both in the form that gives Flex's answer (`attnlab.flexfn`), and attnlab's
dispatcher picks the path: the interval kernel for an interval-shaped mask without a score_mod,
the tiled kernel for the rest (a score_mod is called on each chunk, empty blocks are skipped,
and tensors the score_mod reads get their gradients, `ops.captured`).
"""

from __future__ import annotations

import functools
import weakref

import torch

from attnlab.errors import AttnlabError, fmt_shape
from attnlab.flex.block import BlockMaskMask, classes_of
from attnlab.flexfn import Adapted, adapt
from attnlab.masks import EMPTY, Mask
from attnlab.ops import dispatch
from attnlab.ops.api import attention, make_problem

#: per BlockMask: the attnlab Mask it is (its tile classes and intervals stay with it)
_MASKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: per score_mod: its Adapted form (so a function reused across layers and steps decides once)
_MODS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, kernel_options=None, *, return_aux=None):
    """torch.nn.attention.flex_attention's call, with its meaning, trainable on a CPU.

    Args:
        query: (B, H, L, D). key: (B|1, Hkv, S, D). value: (B|1, Hkv, S, Dv).
        score_mod: score_mod(score, b, h, q_idx, kv_idx) -> score, applied to the scaled scores;
            written for Flex (scalars under vmap) or with broadcasting tensor ops: either runs.
        block_mask: a torch BlockMask (create_block_mask, BlockMask.from_kv_blocks), used as
            compiled Flex uses it (listed blocks only; mask_mod in the partial ones), or an
            attnlab mask (`attnlab.masks.sliding_window(256)`, ...).
        scale: multiplies q·kᵀ; default 1/sqrt(D).
        enable_gqa: H a multiple of Hkv; query head h uses key/value head h // (H / Hkv).
        return_lse: also return the log-sum-exp per row (torch's deprecated form).
        kernel_options: passed to torch on CUDA; on the CPU checked to be a dict and unused.
        return_aux: torch's AuxRequest(lse=..., max_scores=...): return (out, AuxOutput).

    Returns:
        out (B, H, L, Dv) in query's dtype; (out, lse (B, H, L)) with return_lse; (out,
        AuxOutput(lse, max_scores)) with return_aux. lse is float32 (float64 for float64
        inputs), -inf on a row with nothing to attend (whose output is 0).

    Differences from torch on the CPU (torch: forward only there): backward on every path,
    also into tensors score_mod captures; max_scores is returned (torch raises); dropout does
    not exist in either; errors are AttnlabError (a ValueError) naming the argument.
    """
    _check_call(query, key, value, block_mask, return_lse, return_aux, kernel_options)
    if on_cuda(query):
        return _compiled()(query, key, value, score_mod=score_mod,
                           block_mask=_torch_block_mask(block_mask, query, key),
                           scale=scale, enable_gqa=enable_gqa, return_lse=return_lse,
                           kernel_options=kernel_options, return_aux=return_aux)
    want_lse = bool(return_lse) or (return_aux is not None and bool(return_aux.lse))
    want_max = return_aux is not None and bool(return_aux.max_scores)
    mask, mod, fused = mask_of(block_mask, query, key), mod_of(score_mod), None
    if mod is not None:
        fused = fused_of(score_mod, mod, query)
    kw = dict(scale=scale, enable_gqa=enable_gqa, mask=mask, **(fused or {"score_mod": mod}))
    if want_lse or want_max:
        out, lse = attention(query, key, value, return_lse=True, **kw)
    else:
        out, lse = attention(query, key, value, **kw), None
    if return_aux is None:
        return (out, lse) if return_lse else out
    from torch.nn.attention.flex_attention import AuxOutput

    top = None
    if want_max:
        from attnlab.flex.maxima import max_scores

        top = max_scores(query, key, value, lse, **kw)
    return out, AuxOutput(lse=lse if want_lse else None, max_scores=top)


def select_backend(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, kernel_options=None, *,
                   return_aux=None) -> dispatch.Choice:
    """Which path `flex_attention` takes for these inputs, and why; the reason also says which
    form (broadcast or vmap, see `attnlab.flexfn`) the mask_mod and score_mod took."""
    _check_call(query, key, value, block_mask, return_lse, return_aux, kernel_options)
    if on_cuda(query):
        return dispatch.Choice("flex", "CUDA: torch's compiled flex_attention, as given")
    want_lse = bool(return_lse) or return_aux is not None
    mask, mod, fused = mask_of(block_mask, query, key), mod_of(score_mod), None
    if mod is not None:
        fused = fused_of(score_mod, mod, query)
    p = make_problem(query, key, value, None, 0.0, False, scale, enable_gqa, mask=mask,
                     **(fused or {"score_mod": mod}))
    choice = dispatch.choose(p, need_lse=want_lse)
    forms = _forms(p, mod, fused)
    return dispatch.Choice(choice.backend, choice.reason + (f"; {forms}" if forms else ""))


def on_cuda(query) -> bool:
    """The call goes to torch's compiled Flex (tests replace this to walk that path)."""
    return query.device.type == "cuda"


def _forms(p, mod, fused) -> str:
    """Which form each function took (`flexfn.describe`), a fused score_mod's modifiers."""
    from attnlab.flexfn import describe

    said = describe(p)
    if fused:
        what = " and ".join(f"softcap={v:g}" if k == "softcap" else "ALiBi slopes"
                            for k, v in fused.items())
        said.append(f"score_mod {getattr(mod, '__name__', 'score_mod')}: fused as {what}")
    return ", ".join(said)


def _check_call(query, key, value, block_mask, return_lse, return_aux, kernel_options):
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise AttnlabError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise AttnlabError(f"{name}: flex_attention takes 4-D (B, H, L, D) tensors, got "
                               f"shape {fmt_shape(x.shape)}")
    if return_lse and return_aux is not None:
        raise AttnlabError("return_lse: pass either return_lse=True or return_aux=AuxRequest("
                           "lse=True), not both (as torch)")
    if return_aux is not None and not all(hasattr(return_aux, f) for f in ("lse", "max_scores")):
        raise AttnlabError(f"return_aux: expected torch's AuxRequest(lse=..., max_scores=...) or "
                           f"None, got {type(return_aux).__name__}")
    if kernel_options is not None and not isinstance(kernel_options, dict):
        raise AttnlabError(f"kernel_options: expected a dict or None, got "
                           f"{type(kernel_options).__name__}")
    if block_mask is not None and not isinstance(block_mask, Mask) and not hasattr(
            block_mask, "kv_num_blocks"):
        raise AttnlabError(f"block_mask: expected a torch BlockMask, an attnlab mask or None, "
                           f"got {type(block_mask).__name__}")
    if isinstance(block_mask, Mask) or block_mask is None:
        return
    L, S = (int(n) for n in block_mask.seq_lengths)
    if (query.shape[-2], key.shape[-2]) != (L, S):
        raise AttnlabError(
            f"block_mask: made for (Q_LEN, KV_LEN) = ({L}, {S}), but query has L = "
            f"{query.shape[-2]} and key S = {key.shape[-2]}; make a BlockMask for these lengths "
            f"(or crop it with block_mask._adjust, as torch)")
    if block_mask.kv_num_blocks.device != query.device:
        raise AttnlabError(f"block_mask: on {block_mask.kv_num_blocks.device}, query on "
                           f"{query.device}; expected the same device")


def mask_of(block_mask, query, key) -> Mask | None:
    """The attnlab Mask a block_mask means (kept with the BlockMask); None: every pair."""
    if block_mask is None or isinstance(block_mask, Mask):
        return block_mask
    if block_mask in _MASKS:
        return _MASKS[block_mask]
    mask = _made_by_attnlab(block_mask)
    if mask is None:
        from torch.nn.attention.flex_attention import noop_mask

        fn = block_mask.mask_mod
        if fn is noop_mask and bool((classes_of(block_mask) != EMPTY).all()):
            mask = None  # every block listed and nothing to mask: no mask at all
        else:
            mask = BlockMaskMask(block_mask, adapt(fn, score=False))
    _MASKS[block_mask] = mask
    return mask


def _made_by_attnlab(block_mask) -> Mask | None:
    """The attnlab Mask a BlockMask was made from by attnlab's Flex backend (`ops.flex`)."""
    from attnlab.ops import flex as backend

    for mask, per in list(backend._BLOCK_MASKS.items()):
        if any(bm is block_mask for bm in per.values()):
            return mask
    return None


def mod_of(score_mod):
    """score_mod as an Adapted (one per function, kept while the function lives)."""
    if score_mod is None or isinstance(score_mod, Adapted) or callable(
            getattr(score_mod, "bind", None)):
        return score_mod
    try:
        got = _MODS.get(score_mod)
    except TypeError:  # not weak-referenceable: adapted afresh
        return adapt(score_mod, score=True)
    if got is None:
        got = adapt(score_mod, score=True)
        _MODS[score_mod] = got
    return got


def fused_of(score_mod, mod, query) -> dict | None:
    """The built-in modifiers score_mod is exactly (`flex.fuse`), as attention's keyword
    arguments, or None; the graph is read once per function, the slopes once per head count."""
    from attnlab.flex.fuse import builtin_of
    from attnlab.ops.scores import accum_dtype

    if not isinstance(mod, Adapted) or isinstance(score_mod, Adapted):
        return None  # an attnlab modifier (it binds itself), or an Adapted the caller made
    acc = accum_dtype(query.dtype)
    key = ("fused", query.shape[1], acc, str(query.device))
    store = mod.__dict__.setdefault("_fused", {})
    if key not in store:
        store[key] = builtin_of(score_mod, mod, query.shape[1], acc, query.device)
    return store[key]


@functools.lru_cache(maxsize=1)
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention as torch_flex

    return torch.compile(torch_flex, dynamic=False)


def _torch_block_mask(block_mask, query, key):
    """A BlockMask for torch: as given, or built from an attnlab mask's tile classes."""
    if not isinstance(block_mask, Mask):
        return block_mask
    from attnlab.ops import flex as backend

    L, S = query.shape[-2], key.shape[-2]
    mask = block_mask.simplified(L, S)
    return None if mask is None else backend.block_mask(mask, L, S, query.device)
