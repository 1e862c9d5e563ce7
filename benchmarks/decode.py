"""Decode: one query row against a long key/value cache, K+V read per second (CPU).

    .venv/bin/python benchmarks/decode.py                       # the default grid below
    .venv/bin/python benchmarks/decode.py --S 8192 32768 --dtype bf16 --threads 1 2 --busy
    .venv/bin/python benchmarks/decode.py --grow 300 --S 4096 --threads 1   # per-step glue

A decoding step reads every key and value of the cache once, 2·S·Hkv·D·(element size) bytes,
and does a few multiply-adds per byte: its limit is the machine's read bandwidth. Each row of the
table times, in turn in every repeat (a busy machine's load falls on all alike; the order rotated
by one every repeat, `rotated_medians`), one step of
`attnlab.attention` (backend "auto", which takes the decode kernel) and one of
`torch.nn.functional.scaled_dot_product_attention` (enable_gqa=True) on the same cache, and two
plain reads of as many bytes at the same thread count: `torch.sum` over a float32 buffer of the
cache's size ("read", on PyTorch's OpenMP threads), and the compiled kernel's `all_finite` over
another ("read (queue)", on the kernel's own threads and work queue; on 2 cores the OpenMP
threads of one step and the kernel's threads of the next spin against each other, and either
read alone swung from 1 to 50 GB/s between rows of one run). "% of read" is against the faster
of the two: the machine's read bandwidth measured in the same run. Each step reads its own
copy of the cache, so none finds a cache another step has just brought into the CPU's caches (a
large last-level cache holds a step's worth of smaller caches). Columns: K+V GB/s of each,
attnlab's fraction of the measured read bandwidth, × = SDPA time / attnlab time, and where "auto"
chose another backend, the decode kernel's own fraction (backend="decode") for comparison.
Rows with more than one thread also time the same call on one thread in turn: "× 1 thread" =
its time / the row's (at least 1.0: the threads are no slower than one), measured in the same
moments, since a busy machine's load moves between rows; the one-thread step first waits,
untimed, until the process's other threads stop running, as a one-thread program has none
(PyTorch's OpenMP threads spin for milliseconds after the two-thread steps' regions).
`--busy` adds rows with one competing process spinning on a core (one Python loop) during the
timing: two threads must not be slower than one there.

`--grow N` times instead a decoding loop of N steps on one thread, its cache a slice of a
preallocated one that grows by a key each step (as a model's KV cache: every step a new cache
length), each step twice in turn: `attnlab.attention` ("auto"), and the decode kernel's op alone
on the same slice (a float32 query, the intervals made outside the timing). "glue" = the
difference of their medians: what attnlab's Python costs a step around the kernel, measured as
a loop runs it (the kernel's sweep of the cache leaves the CPU's caches cold for it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import attnlab
from attnlab.bench.timing import interleaved_medians
from attnlab.ops.kernels import build

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Case:
    H: int
    Hkv: int
    D: int
    S: int
    dtype: str
    threads: int
    busy: bool

    @property
    def bytes(self) -> int:  # K and V: 2·S·Hkv·D elements
        return 2 * self.S * self.Hkv * self.D * DTYPES[self.dtype].itemsize



def measure(c: Case, repeats: int, sdpa: bool) -> dict:
    dt = DTYPES[c.dtype]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, c.H, 1, c.D, generator=g).to(dt)
    k, v = (torch.randn(1, c.Hkv, c.S, c.D, generator=g).to(dt) for _ in range(2))
    buf, buf_q = (torch.randn(c.bytes // 4, generator=g) for _ in range(2))  # K and V's bytes

    def cache():  # each step its own copy: none reads a cache another step has just warmed
        return k.clone(), v.clone()

    ka, va = cache()
    steps = {"read": lambda: buf.sum(),
             "attnlab": lambda: attnlab.attention(q, ka, va, enable_gqa=True)}
    ops = build.get(None)
    if ops is not None:  # the same bytes read on the compiled kernel's own threads and queue
        steps["read_q"] = lambda: ops.all_finite(buf_q)
    choice = attnlab.select_backend(q, k, v, enable_gqa=True).backend
    if choice != "decode":  # what the decode kernel would do where "auto" leaves it
        kd, vd = cache()
        steps["decode"] = lambda: attnlab.attention(q, kd, vd, enable_gqa=True, backend="decode")
    if c.threads > 1:  # the same call on one thread, timed in turn: 2 threads against 1 at once
        k1, v1 = cache()

        def one_thread():
            torch.set_num_threads(1)
            try:
                attnlab.attention(q, k1, v1, enable_gqa=True)
            finally:
                torch.set_num_threads(c.threads)

        steps["attnlab_1t"] = one_thread
    if sdpa:
        ks, vs = cache()
        steps["sdpa"] = lambda: F.scaled_dot_product_attention(q, ks, vs, enable_gqa=True)
    m = rotated_medians(steps, repeats, before={"attnlab_1t": quiet_threads})
    m["ref"] = min(m["read"], m.get("read_q", m["read"]))  # the faster read: the bar
    return {**m, "backend": choice}


def rotated_medians(steps: dict, repeats: int, before: dict | None = None) -> dict:
    """Median seconds of each step, the steps timed in turn with the order rotated by one every
    repeat: each step follows each other as often (a step right after one that ran on PyTorch's
    OpenMP threads finds them still spinning on the cores, which slowed the kernel's own threads
    there; SDPA and torch.sum run on OpenMP). `before[name]` runs untimed before that step."""
    names = list(steps)
    per = [interleaved_medians({n: steps[n] for n in names[r % len(names):] +
                                names[:r % len(names)]}, 1, warmup=int(r == 0), before=before)
           for r in range(repeats)]
    return {n: statistics.median(p[n] for p in per) for n in names}


def quiet_threads(limit: float = 0.02) -> None:
    """Waits, at most `limit` seconds, until no other thread of this process runs (Linux's
    /proc; elsewhere returns at once): before the one-thread step, as a one-thread program has
    no other threads. PyTorch's OpenMP threads spin ~4 ms after a region on the 2-vCPU Xeon, so
    the one-thread step two steps after `torch.sum` shared a core with one: GQA 32/8, D = 64,
    fp32, 4k-8k, it took up to 2.9x as long as after the wait in the same rotation (× 1 thread
    2.51-3.48 against 1.10-1.73 in the rows where the wait was long, up to 4 ms)."""
    me = threading.get_native_id()
    end = time.perf_counter() + limit
    try:
        tasks = [t for t in os.listdir("/proc/self/task") if int(t) != me]
    except OSError:
        return
    while time.perf_counter() < end:
        running = False
        for t in tasks:
            try:
                with open(f"/proc/self/task/{t}/stat", "rb") as f:
                    running = f.read().rsplit(b")", 1)[1].split()[0] == b"R"
            except OSError:
                continue  # a thread that ended
            if running:
                break
        if not running:
            return


@contextlib.contextmanager
def competing(on: bool):
    """One process spinning on a core while the block runs (a busy machine's neighbour)."""
    if not on:
        yield
        return
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        yield
    finally:
        p.kill()
        p.wait()


def row(c: Case, m: dict) -> str:
    gbs = lambda s: c.bytes / s / 1e9  # noqa: E731
    sd = f"{gbs(m['sdpa']):.2f} | {m['sdpa'] / m['attnlab']:.1f}" if "sdpa" in m else "– | –"
    dk = f"{m['ref'] / m['decode']:.0%}" if "decode" in m else "="
    rq = f"{gbs(m['read_q']):.2f}" if "read_q" in m else "–"
    t1 = f"{m['attnlab_1t'] / m['attnlab']:.2f}" if "attnlab_1t" in m else "–"
    return (f"| {c.threads} | {'yes' if c.busy else 'no'} | {c.H}/{c.Hkv} | {c.D} | {c.S} | "
            f"{c.dtype} | {c.bytes / 2**20:.0f} | {gbs(m['read']):.2f} | {rq} | "
            f"{gbs(m['attnlab']):.2f} | {m['ref'] / m['attnlab']:.0%} | {sd} | "
            f"{m['attnlab'] * 1e3:.2f} | {t1} | {m['backend']} | {dk} |")


def grow(c: Case, steps: int) -> dict:
    """Median seconds per step of attnlab.attention and of the decode op alone, over `steps`
    steps of a cache that grows by one key each step, the two in turn (order swapped every
    step)."""
    dt = DTYPES[c.dtype]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, c.H, 1, c.D, generator=g).to(dt)
    kb, vb = (torch.randn(1, c.Hkv, c.S + steps, c.D, generator=g).to(dt) for _ in range(2))
    ops = build.get(None)
    qf, lo = q.float(), torch.zeros(1, 1, 1, dtype=torch.int32)  # as every build's op takes them
    runs = {"attnlab": lambda k, v, hi: attnlab.attention(q, k, v, enable_gqa=True),
            "op": lambda k, v, hi: ops.decode(qf, k, v, lo, hi, None, c.D ** -0.5, 0.0, 0, 0,
                                              True)}
    times: dict = {n: [] for n in runs}
    for i in range(-1, steps):  # step -1: the first call plans, not timed
        n_keys = c.S + max(i, 0)
        k, v = kb[:, :, :n_keys], vb[:, :, :n_keys]
        hi = torch.full((1, 1, 1), n_keys, dtype=torch.int32)
        for n in (runs if i % 2 else reversed(list(runs))):
            t = time.perf_counter()
            runs[n](k, v, hi)
            if i >= 0:
                times[n].append(time.perf_counter() - t)
    return {n: statistics.median(t) for n, t in times.items()}


GROW_HEADER = ["| H/Hkv | D | S (first step) | dtype | steps | attnlab µs/step | decode op µs/step "
               "| glue µs/step | glue % of step |", "|---|---|---|---|---|---|---|---|---|"]

HEADER = ["| threads | busy | H/Hkv | D | S | dtype | K+V MiB | read GB/s | read (queue) GB/s | "
          "attnlab GB/s | % of read | SDPA GB/s | × SDPA | attnlab ms | × 1 thread | backend | "
          "decode kernel % of read |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", nargs="+", default=["32/8", "8/8"], help="H/Hkv pairs")
    ap.add_argument("--D", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--S", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536])
    ap.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--busy", action="store_true", help="also rows with a competing process")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--sdpa-max-S", type=int, default=65536,
                    help="time SDPA up to this cache length (it is slow beyond)")
    ap.add_argument("--grow", type=int, default=0, metavar="N",
                    help="time N decoding steps of a growing cache on one thread instead: "
                         "attnlab against the decode op alone (the per-step glue)")
    a = ap.parse_args(argv)
    heads = [tuple(int(x) for x in h.split("/")) for h in a.heads]
    if any(len(h) != 2 or h[0] % h[1] for h in heads):
        ap.error("--heads takes H/Hkv pairs with H a multiple of Hkv, e.g. 32/8")
    if a.grow:
        return main_grow(a, heads)
    print(f"# decode: B = 1, L = 1, one step; median of {a.repeats} repeats, the steps timed in "
          f"turn, their order rotated every repeat; torch {torch.__version__}; load "
          f"{os.getloadavg()[0]:.2f}")
    print("\n".join(HEADER))
    n = torch.get_num_threads()
    try:
        for busy in ([False, True] if a.busy else [False]):
            with competing(busy):
                for t in a.threads:
                    torch.set_num_threads(t)
                    for (H, Hkv) in heads:
                        for D in a.D:
                            for dt in a.dtype:
                                for S in a.S:
                                    c = Case(H, Hkv, D, S, dt, t, busy)
                                    m = measure(c, a.repeats, a.sdpa_max_S >= S)
                                    print(row(c, m), flush=True)
    finally:
        torch.set_num_threads(n)
    return 0


def main_grow(a, heads) -> int:
    if build.get(None) is None:
        print("the compiled kernel is not available here: no decode op to compare")
        return 1
    print(f"# decode loop: B = 1, L = 1, {a.grow} steps, the cache one key longer each step, one "
          f"thread; medians; torch {torch.__version__}; load {os.getloadavg()[0]:.2f}")
    print("\n".join(GROW_HEADER))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for (H, Hkv) in heads:
            for D in a.D:
                for dt in a.dtype:
                    for S in a.S:
                        m = grow(Case(H, Hkv, D, S, dt, 1, False), a.grow)
                        glue = m["attnlab"] - m["op"]
                        print(f"| {H}/{Hkv} | {D} | {S} | {dt} | {a.grow} | "
                              f"{m['attnlab'] * 1e6:.0f} | {m['op'] * 1e6:.0f} | "
                              f"{glue * 1e6:.0f} | {glue / m['attnlab']:.0%} |", flush=True)
    finally:
        torch.set_num_threads(n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
