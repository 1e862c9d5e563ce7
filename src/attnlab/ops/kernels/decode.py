"""The decode kernel as attnlab.attention's engine for decode-shaped calls.

A call is decode-shaped when a few query rows (L <= MAX_ROWS: one decoding step, a short
speculative run) attend a long key/value cache, each row one key interval: no mask, SDPA's
`is_causal`, or a structured mask whose `intervals` exist — `causal(align="bottom_right")`, a
ragged batch's `padding(key_lengths)` (each sequence its own cache length, no dense mask),
sliding windows — with softcap and ALiBi; float32, bfloat16 or float16 on the CPU.

The kernel (`csrc/decode.cpp`) reads the cache as stored: every key and value row once per step
for all the query heads that share it (GQA packed), converted to float32 in registers, the keys
of each head split over the threads and merged exactly through their log-sum-exp. A slice of a
preallocated cache is read in place (any batch, head and row strides; unit stride along D).
bfloat16 queries and keys take their q·k from AVX-512 BF16, or from the AMX tile unit where the
CPU has it and Linux grants it (whole 64-key blocks; ATTNLAB_DECODE_AMX=0 turns it off).

A call that needs a gradient runs the interval kernel's forward and backward on the same
intervals (`runner.forward`), so `backend="decode"` is differentiable too: the backward then
recomputes the very scores its forward normalized (the decode kernel sums its dot products in
another order, and a backward from its lse broke FlashAttention's rule for dv, 6× the plain
error, at a negative scale).

Caution: NaN/Inf follow `ops/nonfinite.py`'s rule exactly: the kernel checks every query row and
cache row it reads; when one is not finite the call is cleaned (keys and values zeroed where
poisoned, even without a mask) and the rows that may attend them set to NaN.
"""

from __future__ import annotations

import torch

from attnlab.ops.kernels import applies, runner
from attnlab.ops.problem import Problem

#: query rows of a decode-shaped call at most (csrc/decode.cpp packs a head group's rows)
MAX_ROWS = 16
#: keys from which "auto" takes the decode kernel over SDPA's and the interval kernel
#: (`benchmarks/decode.py`); a forced backend="decode" runs any number of keys
MIN_KEYS = 256
#: keys from which "auto" takes the decode kernel for a plain call with one query head per
#: key/value head (no mask or SDPA's own causal, no modifier, no lse), which SDPA runs as well
#: (`benchmarks/decode.py --heads 8/8 --D 64 128 --S 1024 2048 4096 8192 32768 65536 --dtype
#: fp32 bf16 --threads 1 2 --busy`, five runs): from 4096 keys the decode kernel read as much of
#: the read bandwidth measured in the same run as SDPA's kernel or more in 69 of 80 one-thread
#: cases (bf16 65-103% against 55-87%; fp32 D = 128, the closest, 84-101% against 81-105%), 65
#: of 80 with a busy process, 61 and 75 of 80 on two threads; below, SDPA's kernel read more in
#: 37 of 40 one-thread cases
MHA_MIN_KEYS = 4096


def why_not(p: Problem, need_lse: bool = False) -> str | None:
    """Why the decode kernel cannot run this call (None: it can): the interval kernel's calls
    (`applies.py`)."""
    return applies.why_not(p, "decode")


def takes(p: Problem, need_lse: bool = False) -> bool:
    """"auto" runs this call on the decode kernel: a few query rows, a long enough cache, the
    kernel can run it, and SDPA cannot do as well: grouped query heads (SDPA reads each key/value
    head once per query head), what SDPA does not express (a structured mask other than
    top-left causal, softcap/ALiBi, the lse), or a cache of at least MHA_MIN_KEYS keys (which
    the decode kernel reads as fast as SDPA's kernel or faster). A shorter plain call with one
    query head per key/value head is SDPA's. (Forced, the decode kernel runs any number of rows,
    exactly but not fast.)"""
    if p.dims.L > MAX_ROWS or min_keys(p, need_lse) > p.dims.S:
        return False
    return why_not(p) is None


def min_keys(p: Problem, need_lse: bool = False) -> int:
    """The fewest keys from which `takes` gives a call of p's shape but its cache length the
    decode kernel (its other answers as p's): MIN_KEYS, MHA_MIN_KEYS for a plain
    one-head-per-kv-head call."""
    return MHA_MIN_KEYS if _plain_mha(p, need_lse) else MIN_KEYS


def _plain_mha(p: Problem, need_lse: bool) -> bool:
    """One query head per key/value head, and nothing SDPA cannot say itself."""
    sdpa_says_it = p.structured is None or p.is_plain_causal
    return p.dims.groups == 1 and sdpa_says_it and not p.has_modifiers and not need_lse


def reason(p: Problem, need_lse: bool, isa: str) -> str:
    """select_backend's words for a call `takes` gave the decode kernel."""
    d = p.dims
    head = (f"decode-shaped ({d.L} query rows, {d.S} keys): the compiled decode kernel ({isa}) "
            "reads each key/value row once")
    if d.groups > 1:
        return f"{head} for the {d.groups} query heads that share it, split over the keys"
    if _plain_mha(p, need_lse):
        return (f"{head}, split over the keys: from {MHA_MIN_KEYS} keys it reads the cache as "
                "fast as SDPA's kernel or faster")
    return f"{head}, split over the keys, with what SDPA's kernel cannot express"


def _cache(x: torch.Tensor, d) -> torch.Tensor:
    """(..., Hkv, S, n) as (B, Hkv, S, n) with unit stride along n: read in place as stored."""
    x = runner._batched(x, d)
    return x if x.shape[-1] <= 1 or x.stride(-1) == 1 else x.contiguous()


def forward(p: Problem, need_lse: bool = True, verify: bool = False):
    """(out (..., H, L, Dv) in the input dtype, lse (..., H, L) float32).

    verify: the kernel checks what it reads; the result is None when a query row or a cache row
    it read holds NaN/Inf."""
    from attnlab.ops.kernels import kernel

    d, q, k, v = p.dims, p.query, p.key, p.value
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return runner.forward(p, need_lse, verify=verify)  # training: the interval kernel's
    q = runner._batched(q, d)  # (B, H, L, D)
    k, v = _cache(k, d), _cache(v, d)  # (B, Hkv, S, D|Dv)
    ops = p.memo.get(OPS) or kernel._ops(None)
    lo, hi, slopes = _args(p)
    out, lse, finite = ops.decode(q.contiguous(), k, v, lo, hi, slopes, p.scale,
                                  float(p.softcap or 0.0), 0, 0, verify)
    if verify and not finite:
        return None
    if d.ndim == 4:
        return out, lse  # (B, H, L, Dv), (B, H, L): the call's own shapes
    rows = (*d.batch, d.H, d.L) if d.ndim > 2 else (d.L,)
    return runner._shaped(out, (*rows, d.Dv)), runner._shaped(lse, rows)


#: each build's C (step, key) (`csrc/decode_entry.cpp`), by the id of its ops (held with them)
_STEPS: dict = {}


def _entry(ops) -> tuple:
    """The build's (step, key), or (None, None) where it has no such entry."""
    got = _STEPS.get(id(ops))
    if got is None:
        from attnlab.ops.kernels import build

        fn = build.c_functions("attnlab_decode_entry", ops=ops)
        got = _STEPS[id(ops)] = (ops, fn or (None, None))
    return got[1]


def key_entry():
    """key(query, key, value, max_rows) -> bytes | False | None of a build loaded in this
    process: a decode step's signature without its cache length, read in C (`decode_steps`'s
    `find`), or None where no build is loaded."""
    from attnlab.ops.kernels import build

    ops = build.loaded()
    return None if ops is None else _entry(ops)[1]


def step_entry(ops):
    """step(query, key, value, scale, softcap, min_keys) -> (out, lse, finite), or None where
    that call would not be the kernel's alone (a tensor subclass, a torch function or dispatch
    mode, a functorch transform) or is not a step the op serves as it is (4-D, key and value of
    one length >= min_keys, one batch, unit stride along D): the op's
    decode(q, k, v, None, None, None, scale, softcap, 0, 0, True)
    called as a CPython function of the build whose ops these are, without torch.ops' call
    (`csrc/decode_entry.cpp`; 35-40 µs of a step once the kernel's sweep of the cache left that
    code cold); None where the build has no such entry."""
    return _entry(ops)[0]


#: Problem.memo's entry for the kernel's ops where a caller knows them (`ops/decode_steps.py`:
#: a step plan, under the kernel's switches); else `kernel._ops` looks the build up
OPS = ("kernels.decode_ops", None)


def _args(p: Problem) -> tuple:
    """The kernel's lo, hi (B|1, Hm, L) int32 and slopes (B|1, H) float32 of a validated call
    (`runner._call`'s), or three None for a call with neither a mask nor ALiBi: every row attends
    the whole cache, and no tensors are made."""
    if p.structured is None and p.alibi_slopes is None:
        return None, None, None
    c = runner._call(p, p.dims.Dv)
    return c.lo, c.hi, c.slopes


def checked(p: Problem, need_lse: bool):
    """The decode kernel checking what it reads; when a row it read is not finite, the call
    cleaned and the rows that may attend the poison set to NaN (`ops/nonfinite.py`'s rule, also
    for a call without a mask, where every row may attend every key)."""
    from attnlab.ops import nonfinite

    got = forward(p, need_lse, verify=True)
    if got is not None:
        return got
    p, bad = nonfinite.clean(p, always=True)
    p, bad_q = nonfinite.clean_queries(p)
    out, lse = forward(p, need_lse)
    if bad is not None:
        out, lse = nonfinite.poison(p, bad, out, lse)
    if bad_q is not None:
        out, lse = nonfinite.poison_queries(p, bad_q, out, lse)
    return out, lse
