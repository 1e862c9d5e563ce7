"""The compiled interval kernel against its peers, side by side in one run (markdown tables).

    .venv/bin/python benchmarks/kernel.py             # B=1, H=8, D=64, fp32; ~10 minutes loaded
    .venv/bin/python benchmarks/kernel.py --quick     # L=4096 and 1024, no FlexAttention

Tables: (1) forward, 1 thread: the kernel's AVX-512 and AVX2 builds, today's PyTorch path
(`ATTNLAB_KERNEL=0`, backend "tiled"), compiled FlexAttention (window) or SDPA (causal), useful
GFLOP/s (4·D per allowed pair), their share of PyTorch's GEMM speed on the tile shapes and of
the core's FMA ceiling (registers only, per ISA), both measured in this run;
(2) forward+backward; (3) a busy machine: one competing busy process running, 2 threads vs 1
(interleaved call by call, median of at least 7);
(4) one row of exact weights (`attention_weights`) against a forward: its first call, cold (median
of 7, each right after a forward) and warm.
Times are medians of repeats after a warm-up; the best build and its peer in table (1) are timed
again interleaved call by call (median of at least 5); ratios > 1 mean the kernel is faster.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import attnlab
from attnlab import masks
from attnlab.ops import kernels


@dataclass(frozen=True)
class Config:
    B: int = 1
    H: int = 8
    D: int = 64
    L: int = 16384  # window and documents
    L_causal: int = 4096
    window: int = 256
    docs: int = 8
    repeats: int = 3
    flex: bool = True

    @classmethod
    def quick(cls) -> Config:
        return cls(L=4096, L_causal=1024, repeats=3, flex=False)


@dataclass(frozen=True)
class Case:
    name: str
    L: int
    mask: object  # an attnlab mask
    peer: str  # "flex", "sdpa" or ""


def cases(c: Config) -> list[Case]:
    return [
        Case(f"window {c.window} @ {c.L // 1024}k", c.L, masks.sliding_window(c.window),
             "flex" if c.flex else ""),
        Case(f"{c.docs} documents @ {c.L // 1024}k", c.L,
             masks.document(torch.arange(c.L) // -(-c.L // c.docs)), ""),
        Case(f"causal {c.L_causal // 1024}k", c.L_causal, masks.causal(), "sdpa"),
    ]


#: the clock of every timing: wall time, or with --clock cpu the CPU time of the process (on a
#: machine shared with other jobs, CPU time is what the code costs; wall time adds the waits)
CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCK["wall"]


def med(f, repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    f()
    ts = []
    for _ in range(repeats):
        t0 = clock()
        f()
        ts.append(clock() - t0)
    return statistics.median(ts)


def med_threads(f, repeats: int) -> dict[int, float]:
    """Median seconds of f on 1 and on 2 threads, the two interleaved call by call (a change in
    the machine's load falls on both alike), after a warm-up of each."""
    ts: dict[int, list[float]] = {1: [], 2: []}
    for i in range(repeats + 1):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            t0 = clock()
            f()
            if i:
                ts[threads].append(clock() - t0)
    return {n: statistics.median(t) for n, t in ts.items()}


def med_pair(f, g, repeats: int) -> tuple[float, float]:
    """Median seconds of f and of g, the two interleaved call by call after a warm-up of each:
    a change in the machine's load in the meantime falls on both alike."""
    f()
    g()
    ts: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((f, ts[0]), (g, ts[1])):
            t0 = clock()
            fn()
            out.append(clock() - t0)
    return statistics.median(ts[0]), statistics.median(ts[1])


def ms(t: float, note: str = "") -> str:
    """Milliseconds for a table cell; "–" where there is no such run."""
    return "–" if t != t else f"{t * 1e3:.0f} {note}".strip()


def ratio(a: float, b: float) -> str:
    return "–" if a != a or b != b else f"{a / b:.2f}"


@contextmanager
def env(**kv):
    old = {k: os.environ.get(k) for k in kv}
    os.environ.update({k: v for k, v in kv.items() if v is not None})
    for k, v in kv.items():
        if v is None:
            os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def inputs(c: Config, L: int, grad: bool = False):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(c.B, c.H, L, c.D, generator=g).requires_grad_(grad) for _ in range(3)]


def useful_flops(case: Case, c: Config) -> float:
    lo, hi = case.mask.intervals(case.L, case.L)
    return 4.0 * c.B * c.H * c.D * float((hi - lo).clamp(min=0).sum())  # fwd: 2 GEMMs


def attn_fn(case: Case, q, k, v, bwd: bool):
    """The kernel (backend "interval"), or with ATTNLAB_KERNEL=0 the chunk loop ("tiled")."""
    from attnlab.ops.kernels import build

    def f():
        backend = "interval" if build.enabled() else "tiled"  # the env read at each call
        out = attnlab.attention(q, k, v, mask=case.mask, backend=backend)
        if bwd:
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    return f


def peer_fn(case: Case, q, k, v, bwd: bool):
    """(callable, note) for the case's peer, or (None, why)."""
    if case.peer == "sdpa":
        def f():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            if bwd:
                torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        return f, "SDPA is_causal"
    if case.peer == "flex" and not bwd:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            w = case.mask.size
            bm = create_block_mask(lambda b, h, i, j: (j <= i) & (i - j < w), None, None,
                                   case.L, case.L, device="cpu")
            fn = torch.compile(flex_attention)
            t0 = time.perf_counter()
            with torch.no_grad():
                fn(q, k, v, block_mask=bm)
            note = f"compiled Flex (first call {time.perf_counter() - t0:.0f} s)"
        except Exception as e:  # a peer that does not run here is reported, not fatal
            return None, f"Flex does not run: {type(e).__name__}"

        def g():
            with torch.no_grad():
                fn(q, k, v, block_mask=bm)
        return g, note
    return None, ""


def tile_gemm_peak(repeats: int) -> float:
    """GF/s of PyTorch's GEMM, 1 thread, the best of the attention's tile shapes, batched
    ((256×64)@(64×256) scores, (256×256)@(256×64) values) and one square 1024³ product: what
    this core's FMA units give a well-tuned GEMM in this run."""
    best = 0.0
    for n, m, k_, p in ((64, 256, 64, 256), (64, 256, 256, 64), (1, 1024, 1024, 1024)):
        a, b = torch.randn(n, m, k_), torch.randn(n, k_, p)
        t = med(lambda a=a, b=b: torch.bmm(a, b), repeats * 3)
        best = max(best, 2.0 * n * m * k_ * p / t / 1e9)
    return best


def fma_ceiling(isa: str) -> float:
    """GF/s of one core's FMA units for the kernel's `isa` build: rounds of independent
    multiply-adds on registers, no memory (the `fma_ceiling` op); the best of 5 timings. What a
    perfectly fed micro-kernel would reach, above any GEMM library's speed."""
    from attnlab.ops.kernels.build import get

    ops, iters, best = get(isa), 20_000_000, 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        flops = ops.fma_ceiling(iters)
        best = max(best, flops / (time.perf_counter() - t0) / 1e9)
    return best


def isas() -> list[str]:
    return [i for i in ("avx512", "avx2") if i in kernels.runnable()]


def table_forward(c: Config, peak: float, ceiling: dict[str, float]) -> list[str]:
    rows = ["| case | " + " | ".join(f"kernel {i} ms" for i in isas()) +
            " | today (tiled) ms | peer ms | kernel GF/s | % of tile GEMM peak | "
            "% of FMA ceiling | × peer | × today |", "|---" * (len(isas()) + 8) + "|"]
    for case in cases(c):
        q, k, v = inputs(c, case.L)
        t = {}
        for isa in isas():
            with env(ATTNLAB_KERNEL_ISA=isa):
                t[isa] = med(attn_fn(case, q, k, v, False), c.repeats)
        with env(ATTNLAB_KERNEL="0"):
            today = med(attn_fn(case, q, k, v, False), c.repeats)
        f, note = peer_fn(case, q, k, v, False)
        peer = float("nan")
        if f:  # the best build and the peer again, interleaved: the × peer column
            with env(ATTNLAB_KERNEL_ISA=isas()[0]):
                t[isas()[0]], peer = med_pair(attn_fn(case, q, k, v, False), f,
                                              max(c.repeats, 5))
        best = t[isas()[0]]
        gf = useful_flops(case, c) / best / 1e9
        rows.append(f"| {case.name} | " + " | ".join(f"{t[i] * 1e3:.0f}" for i in isas()) +
                    f" | {today * 1e3:.0f} | {ms(peer, note)} | {gf:.1f} | "
                    f"{100 * gf / peak:.0f}% | {100 * gf / ceiling[isas()[0]]:.0f}% | "
                    f"{ratio(peer, best)} | {today / best:.2f} |")
    return rows


def table_backward(c: Config) -> list[str]:
    rows = ["| case (fwd+bwd) | " + " | ".join(f"kernel {i} ms" for i in isas()) +
            " | today (tiled) ms | peer ms | × today | × peer |", "|---" * (len(isas()) + 5) + "|"]
    for case in cases(c):
        q, k, v = inputs(c, case.L, grad=True)
        t = {}
        for isa in isas():
            with env(ATTNLAB_KERNEL_ISA=isa):
                t[isa] = med(attn_fn(case, q, k, v, True), c.repeats)
        with env(ATTNLAB_KERNEL="0"):
            today = med(attn_fn(case, q, k, v, True), max(1, c.repeats - 2))
        f, note = peer_fn(case, q, k, v, True) if case.peer == "sdpa" else (None, "")
        peer = med(f, c.repeats) if f else float("nan")
        best = t[isas()[0]]
        rows.append(f"| {case.name} | " + " | ".join(f"{t[i] * 1e3:.0f}" for i in isas()) +
                    f" | {today * 1e3:.0f} | {ms(peer, note)} | {today / best:.2f} | "
                    f"{ratio(peer, best)} |")
    return rows


@contextmanager
def busy_process():
    """One competing process spinning on a core for the duration."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield p
    finally:
        p.terminate()
        p.wait(10)


def table_busy(c: Config) -> list[str]:
    rows = ["| case (fwd, one busy process running) | path | 1 thread ms | 2 threads ms | "
            "2 threads / 1 thread |", "|---|---|---|---|---|"]
    n = torch.get_num_threads()
    extra = [Case(f"window {c.window} @ {c.L_causal // 1024}k", c.L_causal,
                  masks.sliding_window(c.window), "")]
    with busy_process():
        for case in [*cases(c), *extra]:
            q, k, v = inputs(c, case.L)
            for path, kw in (("kernel", {}), ("today (tiled)", {"ATTNLAB_KERNEL": "0"})):
                with env(**kw):
                    t = med_threads(attn_fn(case, q, k, v, False), max(c.repeats, 7))
                rows.append(f"| {case.name} | {path} | {t[1] * 1e3:.0f} | {t[2] * 1e3:.0f} | "
                            f"{t[2] / t[1]:.2f} |")
    torch.set_num_threads(n)
    return rows


def table_weights(c: Config) -> list[str]:
    """One row of exact weights against a forward: its first call (for the process or the mask:
    one-time costs included), cold (the median of COLD calls, each for a row not asked before
    and right after a forward, which leaves none of the row's keys in the caches) and warm."""
    rows = ["| case | forward ms | one row of weights ms: first / cold / warm | "
            "share of a forward: first / cold |", "|---|---|---|---|"]

    def once(f) -> float:
        t0 = clock()
        f()
        return clock() - t0

    for case in cases(c)[:2]:
        q, k, v = inputs(c, case.L)
        _, lse = attnlab.attention(q, k, v, mask=case.mask, return_lse=True)
        fwd = med(lambda q=q, k=k, v=v, case=case: attnlab.attention(q, k, v, mask=case.mask),
                  c.repeats)

        def weights(row, q=q, k=k, lse=lse, case=case):
            return attnlab.attention_weights(q, k, lse, rows=[row], mask=case.mask)

        mid = case.L // 2
        first = once(lambda mid=mid: weights(mid))
        cold = []
        for i in range(COLD):
            attnlab.attention(q, k, v, mask=case.mask)
            cold.append(once(lambda row=case.L * (2 * i + 1) // (2 * COLD): weights(row)))
        cold = statistics.median(cold)
        warm = med(lambda mid=mid: weights(mid), c.repeats * 3)
        rows.append(f"| {case.name} | {fwd * 1e3:.0f} | {first * 1e3:.2f} / {cold * 1e3:.2f} / "
                    f"{warm * 1e3:.2f} | {100 * first / fwd:.2f}% / {100 * cold / fwd:.2f}% |")
    return rows


COLD = 7  # cold calls per case


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="L=4096 / 1024, no FlexAttention")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--clock", choices=list(CLOCK), default="wall",
                    help="wall time (default) or the process's CPU time (the busy-machine table "
                         "always uses wall time)")
    ap.add_argument("--only", nargs="+", choices=["fwd", "bwd", "busy", "weights"],
                    default=["fwd", "bwd", "busy", "weights"])
    a = ap.parse_args(argv)
    global clock
    clock = CLOCK[a.clock]
    c = Config.quick() if a.quick else Config()
    if a.repeats:
        c = Config(**{**c.__dict__, "repeats": a.repeats})
    st = kernels.status(build=True)
    for isa in isas():
        kernels.available(isa)  # built before any timing
    torch.set_num_threads(1)
    load = os.getloadavg()
    print(f"# interval kernel: {st.isa} ({st.reason}); fp32, B={c.B}, H={c.H}, D={c.D}; "
          f"{a.clock} clock; {os.cpu_count()} CPUs, load average {load[0]:.1f} at the start")
    if "fwd" in a.only:
        peak = tile_gemm_peak(c.repeats)
        ceiling = {isa: fma_ceiling(isa) for isa in isas()}
        print(f"\n## Forward, 1 thread (this run: PyTorch's tile GEMM {peak:.1f} GF/s; FMA "
              "ceiling " + ", ".join(f"{i} {g:.0f} GF/s" for i, g in ceiling.items()) + ")\n")
        print("\n".join(table_forward(c, peak, ceiling)))
    if "bwd" in a.only:
        print("\n## Forward + backward, 1 thread\n")
        print("\n".join(table_backward(c)))
    if "busy" in a.only:
        clock = CLOCK["wall"]
        print("\n## Busy machine: one competing busy process, 2 threads vs 1\n")
        print("\n".join(table_busy(c)))
    if "weights" in a.only:
        print("\n## One row of exact weights vs a forward (auto backend, 1 thread)\n")
        print("\n".join(table_weights(c)))
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
