"""attnlab.attention: a drop-in for torch.nn.functional.scaled_dot_product_attention.

Each public function validates its call once (`ops.validate.make_problem` -> Problem) and then
runs it; `attention_with_weights` gives the output and exact weights from that one Problem.
"""

from __future__ import annotations

import torch

from attnlab.errors import check_choice, check_softcap
from attnlab.masks import Mask
from attnlab.ops import cheap, decode_steps, dispatch
from attnlab.ops.problem import Problem
from attnlab.ops.validate import make_problem
from attnlab.ops.weights import row_indices, rows_of

__all__ = ["attention", "attention_with_weights", "check_softcap", "make_problem",
           "run_with_weights", "select_backend"]

_TENSOR = torch.Tensor


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    mask: Mask | None = None,
    return_lse: bool = False,
    backend: str = "auto",
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    score_mod=None,
    sinks: torch.Tensor | None = None,
):
    """Scaled dot-product attention: softmax(query · keyᵀ · scale + mask) · value.

    Takes `torch.nn.functional.scaled_dot_product_attention`'s arguments with the same meaning:

    Args:
        query: (..., H, L, D).
        key: (..., Hkv, S, D); Hkv = H unless `enable_gqa`.
        value: (..., Hkv, S, Dv).
        attn_mask: bool (True = may attend) or float (added to the scaled scores), broadcastable
            to (..., H, L, S).
        dropout_p: probability of dropping an attention weight (survivors scaled by 1/(1-p)).
        is_causal: top-left aligned causal mask (query i sees keys j <= i), as SDPA.
        scale: multiplies the scores; default 1/sqrt(D).
        enable_gqa: grouped-query attention, H a multiple of Hkv; query head h uses k/v head
            h // (H / Hkv).

    Keyword-only extras:
        mask: a structured mask from `attnlab.masks` (causal(align=...), sliding_window, padding,
            document, prefix_lm, from_dense, and their & | ~ combinations).
        return_lse: also return the log-sum-exp of each query row, (..., H, L), float32 for
            fp16/bf16 inputs; differentiable on every backend but "reference" (a row with
            nothing to attend: lse -inf and zero gradient).
        backend: "auto" (the fastest exact path; `attnlab.select_backend` says which and why),
            or one forced: "sdpa" (PyTorch's fused kernel), "interval" (the compiled CPU kernel
            for calls whose rows each attend one key interval: no mask, causal, windows,
            documents, prefix-LM, padding and their `&`; float32/float16/bfloat16), "decode"
            (the compiled CPU kernel for at most 16 query rows against a long key/value cache,
            the same masks), "tiled"
            (online softmax over key chunks, skips masked-out tiles, any mask, memory linear
            in L), "math" (plain PyTorch, full score matrix), "reference" (NumPy float64, no
            autograd) or "flex" (PyTorch's FlexAttention). A forced backend that cannot run
            the call raises an AttnlabError saying why.
        softcap: tanh soft-capping of the scaled scores, softcap · tanh(s / softcap) (Gemma 2),
            applied before any bias or mask.
        alibi_slopes: (H,) ALiBi slopes; adds slope_h · (j - i) to head h's scores. Only the
            lse depends on the diagonal's alignment; the output does not. For symmetric ALiBi,
            (B, H) slopes or bottom-right / ragged alignment, pass score_mod=masks.alibi(...).
        score_mod: FlexAttention's score_mod(score, b, h, q_idx, kv_idx) -> score, applied to
            the scaled scores before any other modifier, written with elementwise tensor ops
            (attnlab calls it on broadcast index tensors b (B, 1, 1, 1), h (1, H, 1, 1), q_idx
            (1, 1, L, 1), kv_idx (1, 1, 1, S); torch's Flex on scalars). Forward and backward
            on "math", "tiled" (its plain path) and "flex" (CUDA), with gradients into the
            tensors fn reads that need one (a learned bias table), as FlexAttention's backward
            returns them; "reference" computes it in float64 and refuses such tensors (no
            autograd), as does "flex" on CPU (forward only).
        sinks: (H,) learned attention sinks (GPT-OSS): one extra logit t_h per head in every
            row's softmax denominator, with no value: w_ij = exp(s_ij) / (exp(t_h) + Σ_j
            exp(s_ij)). Not scaled, not modified or masked. On every backend (each one's out
            and lse, the sink joined exactly: `attnlab.ops.sinks`), forward and backward, with
            gradients to the sinks. The returned lse then includes the sink, log(exp(t_h) + Σ_j
            exp(s_ij)), so weights recomputed from it (`attention_weights`) are the sink's
            weights, which sum to 1 - exp(t_h - lse). A row with nothing to attend gets
            output 0 (the sink takes all the mass, as transformers' eager GPT-OSS gives), lse
            t_h and zero gradient to query, key and value.

    All masks given (attn_mask, is_causal, mask) apply together: a pair may attend only if every
    one allows it. A query row that may attend to nothing gets output 0 and lse -inf (t_h with
    sinks), never NaN;
    NaN/Inf in a key or value that no query may attend never reaches the output.

    Returns:
        out (..., H, L, Dv) in the input dtype, or (out, lse) with `return_lse=True`.

    Raises:
        AttnlabError: on bad input, naming the argument and showing the shapes.
    """
    sig = None
    if backend == "auto" and attn_mask is None and alibi_slopes is None and score_mod is None \
            and sinks is None:  # the cheap path: a signature seen before (`ops/cheap.py`)
        if decode_steps.serve is not None:  # a decode step served whole in C
            got = decode_steps.serve(query, key, value, dropout_p, is_causal, scale, enable_gqa,
                                     mask, softcap, return_lse)
            if got is not None:
                return got
        got = cheap.serve(query, key, value, dropout_p, is_causal, scale, enable_gqa, mask,
                          softcap, return_lse)  # the output where a C plan served the call
        if type(got) is _TENSOR:
            return got
        step = None  # a decode step whose cache grew (`ops/decode_steps.py`), before the probe
        if decode_steps.kept():
            step, out = decode_steps.find(query, key, value, dropout_p, is_causal, scale,
                                          enable_gqa, mask, softcap, return_lse)
            if out is not None:
                return out
        sig, plan = cheap.find(query, key, value, dropout_p, is_causal, scale, enable_gqa, mask,
                               softcap, return_lse, got)
        if plan is not None and plan.call is not None:  # SDPA's kernel as it is
            out = plan.call(query, key, value)
            if out is not None:
                return out
        if plan is not None:
            p = cheap.problem(plan, query, key, value)
            out, lse = dispatch.run(plan.backend, p, need_lse=return_lse)
            return (out, lse) if return_lse else out
        if sig is not None and step is None:  # the first decode step's signature
            step, out = decode_steps.find(query, key, value, dropout_p, is_causal, scale,
                                          enable_gqa, mask, softcap, return_lse)
            if out is not None:
                return out
    p = make_problem(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                     mask=mask, softcap=softcap, alibi_slopes=alibi_slopes, score_mod=score_mod,
                     sinks=sinks)
    check_choice("backend", backend, dispatch.BACKENDS)
    if sig is not None:
        name = dispatch.choose(p, return_lse).backend
        if name == "decode":  # kept without its cache length: the next steps' too
            decode_steps.keep(step, p, mask, return_lse, is_causal)
        else:
            cheap.keep(sig, p, name, mask, return_lse)
        out, lse = dispatch.run(name, p, need_lse=return_lse)
        return (out, lse) if return_lse else out
    out, lse = dispatch.run(backend, p, need_lse=return_lse)
    return (out, lse) if return_lse else out


def select_backend(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False, *, mask=None, return_lse=False, softcap=None,
                   alibi_slopes=None, score_mod=None, sinks=None) -> dispatch.Choice:
    """Which backend `attention(..., backend="auto")` would run for these inputs, and why.

    Returns a Choice(backend, reason), backend one of `attnlab.BACKENDS` but "auto": on the CPU
    "decode" (a decode-shaped call: at most 16 query rows, a cache of 256 keys or more, rows of
    one key interval each), "interval" (the compiled kernel: an interval-shaped mask,
    softcap/ALiBi or the lse, where it is built and not turned off by ATTNLAB_KERNEL=0), "sdpa"
    (no mask, top-left causal, small or dense masks), "tiled" (score_mod, masks that leave tiles
    empty or are too long for a dense mask), "math" (a float attn_mask that needs a gradient,
    empty inputs); on CUDA "sdpa", "flex" or "math". "reference" is never chosen: it is the
    oracle. `sinks` choose as an lse request does: they join every backend's out through its lse.
    The reason also says which form each mask function and score_mod took on the CPU
    ("broadcast", or "vmap" for functions written for Flex's scalar calls, `attnlab.flexfn`).
    """
    p = make_problem(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                     mask=mask, softcap=softcap, alibi_slopes=alibi_slopes, score_mod=score_mod,
                     sinks=sinks)
    from attnlab.flexfn import describe

    choice = dispatch.choose(p, need_lse=return_lse)
    forms = describe(p)  # which form each Flex function took: broadcast, or vmap
    return dispatch.Choice(choice.backend, "; ".join([choice.reason, *forms]))


#: query rows of weights recomputed at a time: besides the returned weights, only a block of this
#: many rows of scores is ever held, so long inputs cost no second L×S matrix of intermediates
WEIGHT_ROWS = 1024


def attention_with_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    mask: Mask | None = None,
    rows=None,
    return_lse: bool = False,
    backend: str = "auto",
    softcap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    score_mod=None,
    sinks: torch.Tensor | None = None,
):
    """`attention`'s output and the exact attention weights of the rows asked for, in one call.

    The call is validated once; the weights are recomputed from the output's log-sum-exp with the
    same scale, masks and modifiers (w = exp(score - lse), no second softmax), in blocks of
    WEIGHT_ROWS rows, so the fast kernels still compute the output.

    Args: as `attention`, plus
        rows: which query rows' weights: None (all), an int, a slice or a sequence of ints.

    Returns:
        (out (..., H, L, Dv), weights (..., H, R, S) in the accumulation dtype), or
        (out, lse, weights) with `return_lse=True`. The weights are those before dropout;
        with `sinks` they are the sink's (each row sums to 1 - exp(t_h - lse)).
    """
    p = make_problem(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                     mask=mask, softcap=softcap, alibi_slopes=alibi_slopes, score_mod=score_mod,
                     sinks=sinks)
    check_choice("backend", backend, dispatch.BACKENDS)
    out, lse, w = run_with_weights(p, backend=backend, rows=rows)
    return (out, lse, w) if return_lse else (out, w)


def run_with_weights(p: Problem, *, backend: str = "auto", rows=None,
                     row_block: int = WEIGHT_ROWS):
    """(out, lse, weights (..., H, R, S)) of a Problem already built by `make_problem`.

    The internal entry for callers that validate themselves and reuse the Problem (its `scale`
    and `dense_masks()`) for more than the weights, e.g. to record the call.
    """
    out, lse = dispatch.run(backend, p, need_lse=True)
    idx = row_indices(rows, p.dims.L, p.query.device)
    if idx.numel() <= row_block:
        return out, lse, rows_of(p, lse, idx)
    w = None
    for r in range(0, idx.numel(), row_block):  # one block of scores alive at a time
        block = rows_of(p, lse, idx[r:r + row_block])  # (..., H, ≤row_block, S)
        if w is None:
            w = block.new_empty(*block.shape[:-2], idx.numel(), p.dims.S)  # (..., H, R, S)
        w[..., r:r + block.shape[-2], :] = block
    return out, lse, w
