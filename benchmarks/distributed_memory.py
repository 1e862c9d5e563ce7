"""The memory table of benchmarks/distributed.py: how much memory one forward + backward takes per
rank, one process against ring / all-gather / Ulysses at P ranks.

Three numbers, each (P, strategy) in fresh processes, after one warm-up call of the same shapes
(kernel loaded, plan cached, gradients then dropped):

* **peak RSS**: the process's peak resident size over its life (Linux's VmHWM: the interpreter
  and torch, the inputs, the calls): what the machine must have per rank.
* **RSS added**: the resident-set high-water mark the measured call adds — VmHWM after resetting
  it (`/proc/self/clear_refs` <- 5) minus VmRSS before the call, with glibc's mmap threshold
  fixed at 128 KiB (MALLOC_MMAP_THRESHOLD_) so that a freed buffer goes back to the system. It
  flatters a call that reuses blocks the kernel's pool kept from the warm-up call.
* **tensors**: the peak of live tensor bytes the call adds: every storage an aten op creates
  counts until it is freed (`attnlab.distributed.ledger.TensorLedger`, a `TorchDispatchMode`
  with weakref finalizers). What the code holds: no allocator slack, nothing a kernel allocates
  inside its own ops.

The two RSS numbers come from processes that run no ledger: under a dispatch mode the kernel's
pool is bypassed (every tensor comes from at::empty so the mode sees it) while the blocks the pool
kept from earlier calls stay resident, so a ledger pass in the same process added ~100 MiB per
rank at causal L = 32k to the peak the process showed, one process and ranks alike.

Each rank creates its q, k, v shards one whole tensor at a time (a job never holds the whole
sequence on every rank; one process holds all of it).

    .venv/bin/python benchmarks/distributed.py --memory --L 32768 --heads 4 --world 2
"""

from __future__ import annotations

import gc
import os

import torch

from attnlab.distributed.ledger import TensorLedger

STRATEGIES = ("ring", "allgather", "ulysses")


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def measure(step, tensors, what: str) -> dict:
    """One call of `step` after a warm-up call: `what` "rss" -> {"peak": the process's VmHWM,
    "rss": MiB the call adds}; "tensors" -> {"tensors": MiB, "at_peak", "where"} (a ledger)."""
    step()  # warm-up: kernel loaded, plan cached
    for x in tensors:
        x.grad = None
    gc.collect()
    if what == "tensors":
        with TensorLedger() as ledger:
            step()
        return {"tensors": ledger.peak / 2**20, "at_peak": ledger.at_peak,
                "where": ledger.where}
    before = _status_kib("VmHWM")  # the setup's and the warm-up's peak
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    base = _status_kib("VmRSS")
    step()
    after = _status_kib("VmHWM")
    return {"rss": (after - base) / 1024, "peak": max(before, after) / 1024}


def _rank(rank, world, L, H, D, strategy, what="rss") -> dict:
    g = torch.Generator().manual_seed(0)
    if strategy == "single":
        import attnlab

        q, k, v = (torch.randn(1, H, L, D, generator=g).requires_grad_() for _ in range(3))

        def step():
            attnlab.attention(q, k, v, is_causal=True).sum().backward()
    else:
        import attnlab.distributed as cp

        def part():  # one whole tensor at a time: this rank's shard of it
            return cp.shard(torch.randn(1, H, L, D, generator=g)).requires_grad_()

        q, k, v = part(), part(), part()

        def step():
            cp.context_parallel_attention(q, k, v, strategy=strategy,
                                          is_causal=True).sum().backward()
    return measure(step, (q, k, v), what)


def memory_table(L: int, H: int, D: int, world: int) -> None:
    from attnlab.distributed import spawn

    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)  # read by the fresh processes

    print(f"\n## memory of a causal fwd+bwd per rank: L={L}, B=1, H={H}, D={D}, fp32, zigzag; "
          f"1 thread per rank, gloo on loopback; load average {os.getloadavg()[0]:.1f} at the "
          f"start. peak RSS: the process's VmHWM; RSS added: VmHWM after clear_refs minus VmRSS "
          f"before the call (glibc mmap threshold 128 KiB); tensors: the peak of live tensor "
          f"bytes the call adds (TensorLedger, in a process of its own); after one warm-up "
          f"call, in fresh processes, the busiest rank\n")

    def run(P, strategy):
        kw = {} if P == 1 else {"group_timeout_s": 900}
        rss = spawn(_rank, P, L, H, D, strategy, "rss", timeout_s=3600, **kw)
        ten = spawn(_rank, P, L, H, D, strategy, "tensors", timeout_s=3600, **kw)
        return (max(r["peak"] for r in rss), max(r["rss"] for r in rss),
                max(r["tensors"] for r in ten))

    one = run(1, "single")
    print("| P | strategy | peak RSS MiB/rank | × one process | RSS added MiB | tensors MiB/rank "
          "| × one process |")
    print("|---|---|---|---|---|---|---|")
    print(f"| 1 | attnlab.attention | {one[0]:,.0f} | 1.00 | {one[1]:,.0f} | {one[2]:,.0f} "
          f"| 1.00 |", flush=True)
    for s in STRATEGIES:
        peak, rss, ten = run(world, s)
        print(f"| {world} | {s} | {peak:,.0f} | {peak / one[0]:.2f} | {rss:,.0f} | {ten:,.0f} "
              f"| {ten / one[2]:.2f} |", flush=True)
