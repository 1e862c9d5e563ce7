"""The interval kernel: compiled CPU attention where each query row attends one key interval.

Query row i attends keys j with lo[i] <= j < hi[i]; causal masks (either alignment), sliding
windows, documents, prefix-LM, padding and their `&` all give such intervals
(`Mask.intervals`). The kernel computes only the keys inside each panel's intervals, with
register-blocked FMA micro-kernels, an online softmax, fused softcap and ALiBi, GQA without
copies, and a FlashAttention-2 backward (a dK/dV pass and a dQ pass, no atomics); each pass is
one shared queue of (batch·head, panel) work items, handed out costliest first to the
calling thread and its helpers; the call waits for claimed items, never for a late thread.
The backward adds dQ during the dK/dV pass when there are at least two (batch, kv head)
items per thread (ATTNLAB_KERNEL_BWD=fused|split forces a schedule).

    from attnlab.ops import kernels
    kernels.status()                       # KernelStatus(built, isa, reason, runnable)
    kernels.available()                    # builds on first use; False -> PyTorch path
    out, lse = kernels.interval_attention(q, k, v, lo, hi, scale=0.125)
    w = kernels.interval_weights(q, k, lse, lo, hi, rows=[7], scale=0.125)  # (B, H, 1, S)

Files: isa.py (on or off, the CPU's ISAs, the chosen one), build.py (flags, cache, loading, status),
toolchain.py (ninja, the build lock), gate.py (checks, layouts), kernel.py (the three layers),
csrc/ (the C++: vec.h the SIMD vocabulary, tiles.h the micro-kernels, fwd.cpp, bwd.cpp,
weights.cpp the rows of exact weights, ops.cpp the ops and the glue's reductions, queue.h their
work queue, decode.cpp the decode kernel, helpers.h its own helper threads, pool.h the cache of
large freed buffers, probe.cpp the cheap path's signature and NaN/Inf check of a small call in one
op, serve.cpp the cheap path's plans of SDPA calls served in one C call from Python,
`ops/cheap.py`).

Supported: float32, float16 and bfloat16 inputs (converted to float32 at the gate, accumulated in
float32; out in q's dtype, lse float32); CPU tensors of any strides: read in place when each
head's rows are contiguous (any batch and head strides), else copied at the gate.
Caution: float64 is not supported (attnlab's other paths compute it in float64); keys and values
at positions no row attends must be finite (`attnlab.attention` has the kernel check every key
and each query and value row it reads as it reads them, and cleans them when one is not).
"""

from __future__ import annotations

import torch

from attnlab.ops.kernels.build import KernelStatus, status
from attnlab.ops.kernels.build import get as _get
from attnlab.ops.kernels.isa import ISAS, runnable

__all__ = ["ISAS", "KernelStatus", "available", "cached_bytes", "interval_attention",
           "interval_backward", "interval_forward", "interval_weights", "release_cached",
           "runnable", "status", "zeros"]


def available(isa: str | None = None) -> bool:
    """True when the kernel can run: not turned off (ATTNLAB_KERNEL=0) and built (on first use)
    for `isa` (default: ATTNLAB_KERNEL_ISA or the best ISA of this CPU)."""
    return _get(isa) is not None  # None when turned off


def cached_bytes(isa: str | None = None) -> int:
    """Bytes of freed large buffers (1 MiB and more) the kernel keeps for its next calls, at most
    512 MiB; 0 when the cache is off (ATTNLAB_KERNEL_POOL=0) or the kernel is not built."""
    ops = _get(isa)
    return 0 if ops is None else int(ops.pool_cached_bytes())


def release_cached(keep_bytes: int = 0) -> int:
    """Return the freed blocks the kernel keeps (`cached_bytes`) to the system until at most
    `keep_bytes` stay; the bytes released (0 when the kernel is not loaded). Never builds."""
    from attnlab.ops.kernels import build

    ops = build.loaded()
    return 0 if ops is None else int(ops.pool_trim(int(keep_bytes)))


def zeros(*size: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """torch.zeros(size, dtype=dtype, device=device); a float32 CPU one from the kernel's pool
    of freed blocks once the kernel is loaded (a large fresh buffer costs a page fault per 4 KiB
    page on every call: 15 ms for 16 MiB on a VM; from the pool it is a memset)."""
    from attnlab.ops.kernels import build

    ops = build.loaded()
    if ops is not None and dtype == torch.float32 and torch.device(device or "cpu").type == "cpu":
        return ops.pool_zeros(list(size))
    return torch.zeros(size, dtype=dtype, device=device)


def interval_forward(q, k, v, lo, hi, *, scale, softcap=None, alibi=None, q_pos0=0, k_pos0=0,
                     isa=None):
    """(out, lse) of interval attention, without autograd.

    Args:
        q: (B, H, L, D). k: (B, Hkv, S, D), v: (B, Hkv, S, Dv); H a multiple of Hkv (query head
            h reads key/value head h // (H / Hkv), nothing copied).
        lo, hi: integer (B|1, H|1, L): row i attends keys lo <= j < hi (lo >= hi: nothing).
        scale: multiplies q·k. softcap: scores -> softcap·tanh(scores/softcap).
        alibi: slopes (H,) or (B, H): adds slope·(j - i) at global positions q_pos0 + i and
            k_pos0 + j (a context-parallel block passes its offsets).
        isa: force one build ("avx512", "avx2", "scalar"); default the chosen one.

    Returns:
        out (B, H, L, Dv) in q's dtype (rows with no key: 0), lse float32 (B, H, L) (-inf there).

    Raises:
        AttnlabError on bad arguments; KernelUnavailable (an AttnlabError and a
        RuntimeError) when the kernel is not available.
    """
    from attnlab.ops.kernels import gate, kernel

    c = gate.check(q, k, v, lo, hi, scale=scale, softcap=softcap, alibi=alibi, q_pos0=q_pos0,
                   k_pos0=k_pos0)
    out, lse, _, _ = kernel._fwd(c, q, k, v, isa)
    return out, lse


def interval_backward(q, k, v, lo, hi, out, lse, dout, dlse=None, *, scale, softcap=None,
                      alibi=None, q_pos0=0, k_pos0=0, isa=None):
    """(dq, dk, dv) of interval attention given its out, lse and their gradients dout (and dlse,
    None: zero). out and lse may cover more keys than k, v (a context-parallel block): the result
    is then these keys' share. Rows with lse -inf get zero gradient. Arguments as
    `interval_forward`."""
    from attnlab.ops.kernels import gate, kernel

    c = gate.check(q, k, v, lo, hi, scale=scale, softcap=softcap, alibi=alibi, q_pos0=q_pos0,
                   k_pos0=k_pos0)
    gate.check_outputs(c, out, lse, dout, dlse)
    return kernel._bwd(c, q, k, v, out, lse, dout, dlse, None, isa)


def interval_attention(q, k, v, lo, hi, *, scale, softcap=None, alibi=None, q_pos0=0, k_pos0=0,
                       isa=None):
    """`interval_forward` with autograd through out and lse (gradients to q, k, v)."""
    from attnlab.ops.kernels import gate, kernel

    c = gate.check(q, k, v, lo, hi, scale=scale, softcap=softcap, alibi=alibi, q_pos0=q_pos0,
                   k_pos0=k_pos0)
    out, lse, _ = kernel.IntervalAttention.apply(q, k, v, c, isa)  # _: finite, unchecked
    return out, lse


def interval_weights(q, k, lse, lo, hi, rows=None, *, scale, softcap=None, alibi=None, q_pos0=0,
                     k_pos0=0, isa=None):
    """(B, H, R, S) float32: rows of interval attention's weights exp(s - lse), exactly, from the
    lse its forward returned; s is the forward's score (scale, softcap, ALiBi, the interval), so
    each row with keys sums to 1 and every weight outside a row's interval is exactly 0.

    Args:
        q, k, lo, hi, scale, softcap, alibi, q_pos0, k_pos0, isa: as `interval_forward`.
        lse: (B, H, L), as `interval_forward` returned it (-inf: the row attends nothing).
        rows: which query rows, as `attnlab.attention_weights` takes them (None: all).

    Only the keys some requested row attends are scored: one row of a window costs its window.
    """
    from attnlab.errors import AttnlabError, fmt_shape
    from attnlab.ops.kernels import gate, kernel
    from attnlab.ops.weights import row_indices

    c = gate.check(q, k, None, lo, hi, scale=scale, softcap=softcap, alibi=alibi, q_pos0=q_pos0,
                   k_pos0=k_pos0, values=False)
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (c.B, c.H, c.L):
        got = fmt_shape(lse.shape) if isinstance(lse, torch.Tensor) else type(lse).__name__
        raise AttnlabError(f"lse: expected (B, H, L) = ({c.B}, {c.H}, {c.L}), got {got}")
    return kernel._weights(c, q, k, lse, row_indices(rows, c.L, q.device), isa)
