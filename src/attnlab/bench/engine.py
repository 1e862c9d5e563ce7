"""The attention benchmark behind `attnlab bench` and `benchmarks/attention.py`.

Frozen configs, a warm-up, the median of repeats, FLOPs counted explicitly (4·B·H·D per unmasked
(query, key) pair forward; forward+backward counts 3.5× the forward) and peak memory. Every peer
runs in the same process on the same inputs, so the ratios compare like with like.

Peak memory: torch allocations are invisible to tracemalloc, so this reads the kernel's own
high-water mark of the process (VmHWM in /proc/self/status), reset before each measured call
through /proc/self/clear_refs; "peak extra" = high-water mark minus the resident size just before
the call, i.e. everything the call allocated on top of its inputs (outputs included). Linux only;
elsewhere the column says "n/a".
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from attnlab.bench.case import DTYPES, MASKS, MODES, PEERS, Case, Result
from attnlab.errors import AttnlabError

__all__ = ["DTYPES", "MASKS", "MODES", "PEERS", "Case", "Result", "make_inputs", "measure",
           "measure_weights", "runner", "structured_mask"]

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def structured_mask(case: Case):
    from attnlab import masks

    if case.mask == "causal":
        return masks.causal()
    if case.mask == "sliding256":
        return masks.sliding_window(256)
    if case.mask == "document8":
        return masks.document(torch.arange(case.L) // -(-case.L // 8))
    return None


def make_inputs(case: Case, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shape = (case.B, case.H, case.L, case.D)
    dt = TORCH_DTYPES[case.dtype]
    xs = [torch.randn(shape, generator=g).to(dt) for _ in range(3)]
    if case.mode == "fwd+bwd":
        for x in xs:
            x.requires_grad_(True)
    return xs


def runner(impl: str, case: Case, q, k, v):
    """A no-argument callable doing one forward (and backward), plus a note; None if n/a."""
    import attnlab

    m = structured_mask(case)
    scale = 1.0 / math.sqrt(case.D)
    note = ""
    if impl in ("attnlab", "tiled"):
        kw = {"is_causal": True} if case.mask == "causal" else {"mask": m}
        if impl == "tiled":
            kw["backend"] = "tiled"
        else:
            note = "auto→" + attnlab.select_backend(q, k, v, **kw).backend
        f = lambda: attnlab.attention(q, k, v, **kw)  # noqa: E731
    elif impl == "sdpa":
        dense = None if m is None or case.mask == "causal" else m.to_dense(case.L, case.L)[0, 0]
        note = "dense mask" if dense is not None else "fused"
        f = lambda: F.scaled_dot_product_attention(  # noqa: E731
            q, k, v, attn_mask=dense, is_causal=case.mask == "causal")
    elif impl == "naive":
        dense = None if m is None else m.to_dense(case.L, case.L)[0, 0]

        def f():
            s = (q @ k.transpose(-2, -1)) * scale  # (B, H, L, D) @ (B, H, D, S) -> (B, H, L, S)
            if dense is not None:
                s = s.masked_fill(~dense, float("-inf"))
            return torch.softmax(s, dim=-1) @ v  # (B, H, L, S) @ (B, H, S, D)
    elif impl == "flex":
        f, note = _flex(case, q, k, v)
        if f is None:
            return None, note
    else:
        raise AttnlabError(f"impl: expected attnlab, tiled or one of {', '.join(PEERS)}, "
                           f"got {impl!r}")
    if case.mode == "fwd":
        return (lambda: f()), note
    grad = torch.ones(case.B, case.H, case.L, case.D, dtype=q.dtype) / case.L

    def fb():
        out = f()
        torch.autograd.grad(out, (q, k, v), grad)
    return fb, note


def _flex(case: Case, q, k, v):
    """FlexAttention under torch.compile with a block mask, where it runs; compile time noted."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None, "not in this torch"
    mods = {
        "full": lambda b, h, i, j: i >= 0,
        "causal": lambda b, h, i, j: j <= i,
        "sliding256": lambda b, h, i, j: (j <= i) & (i - j < 256),
    }
    if case.mask == "document8":
        doc = torch.arange(case.L) // -(-case.L // 8)
        mods["document8"] = lambda b, h, i, j: doc[i] == doc[j]
    try:
        bm = create_block_mask(mods[case.mask], None, None, case.L, case.L, device="cpu")
        torch._dynamo.reset()  # a fresh compile per case: no recompile limit across cases
        fn = torch.compile(flex_attention)
        t0 = time.perf_counter()
        out = fn(q, k, v, block_mask=bm)
        if case.mode == "fwd+bwd":
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        note = f"compiled, first call {time.perf_counter() - t0:.0f} s"
    except Exception as e:  # any failure to compile or run is reported as "does not run"
        return None, f"does not run: {type(e).__name__}"
    return (lambda: fn(q, k, v, block_mask=bm)), note


def _rss_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def measure(items, case: Case) -> dict:
    """Time several implementations of one case, interleaved, so drift hits all alike.

    items: (impl, fn, note, repeats, warmup). Each gets its warm-up, then one run with the memory
    high-water mark reset, then the remaining repeats round-robin with the others.
    """
    times, peaks = {}, {}
    for impl, fn, _, _, warmup in items:
        for _ in range(warmup):
            fn()
        ok = _reset_peak()
        before = _rss_kib("VmRSS")
        t0 = time.perf_counter()
        fn()
        times[impl] = [time.perf_counter() - t0]
        peak = _rss_kib("VmHWM") if ok else None
        peaks[impl] = None if peak is None or before is None else max(0, peak - before) / 1024
    for r in range(1, max((it[3] for it in items), default=1)):
        for impl, fn, _, repeats, _ in items:
            if r < repeats:
                t0 = time.perf_counter()
                fn()
                times[impl].append(time.perf_counter() - t0)
    out = {}
    for impl, _, note, _, _ in items:
        ms = sorted(times[impl])[len(times[impl]) // 2] * 1e3
        out[impl] = Result(impl, ms, case.flops / (ms * 1e-3) / 1e9, peaks[impl], note)
    return out


def measure_weights(case: Case, q, k, v, repeats: int = 5) -> Result:
    """One query row (the last) of exact weights from the saved lse, after one forward."""
    import attnlab

    kw = {"is_causal": True} if case.mask == "causal" else {"mask": structured_mask(case)}
    with torch.no_grad():
        _, lse = attnlab.attention(q, k, v, return_lse=True, **kw)
        row = [case.L - 1]
        attnlab.attention_weights(q, k, lse, rows=row, **kw)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            attnlab.attention_weights(q, k, lse, rows=row, **kw)
            times.append(time.perf_counter() - t0)
    ms = sorted(times)[len(times) // 2] * 1e3
    return Result("weights, 1 row", ms, None, None, "attention_weights from the saved lse")
