"""The memory table of benchmarks/distributed.py: how much memory one forward + backward adds per
rank, one process against ring / all-gather / Ulysses at P ranks.

Two methods, both in fresh processes, after one warm-up call of the same shapes (kernel loaded,
plan cached, gradients then dropped):

* **RSS**: the resident-set high-water mark the call adds — Linux's VmHWM after resetting it
  (`/proc/self/clear_refs` ← 5) minus VmRSS before the call, with glibc's mmap threshold fixed
  at 128 KiB (MALLOC_MMAP_THRESHOLD_) so that a freed buffer goes back to the system instead of
  being reused unseen by the next call. What the operating system saw: tensors, the
  allocator's slack, gloo's buffers, the kernel's own workspace.
* **tensors**: the peak of live tensor bytes the call adds: every storage an aten op creates
  counts until it is freed (`attnlab.distributed.ledger.TensorLedger`, a `TorchDispatchMode`
  with weakref finalizers). What the code holds: no allocator slack, nothing a kernel allocates
  outside torch.

Both count what a call adds: the output, the three gradients, and everything transient. The
inputs (and, per rank, the shards) exist before.

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


def measure(step, tensors) -> dict:
    """{"rss": MiB, "tensors": MiB} one call of `step` adds (after a warm-up call)."""
    step()  # warm-up: kernel loaded, plan cached
    for x in tensors:
        x.grad = None
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    base = _status_kib("VmRSS")
    step()
    rss = (_status_kib("VmHWM") - base) / 1024
    for x in tensors:
        x.grad = None
    gc.collect()
    with TensorLedger() as ledger:
        step()
    return {"rss": rss, "tensors": ledger.peak / 2**20, "at_peak": ledger.at_peak,
            "where": ledger.where}


def _rank(rank, world, L, H, D, strategy) -> dict:
    g = torch.Generator().manual_seed(0)
    whole = [torch.randn(1, H, L, D, generator=g) for _ in range(3)]
    if strategy == "single":
        import attnlab

        q, k, v = (x.requires_grad_() for x in whole)

        def step():
            attnlab.attention(q, k, v, is_causal=True).sum().backward()
    else:
        import attnlab.distributed as cp

        q, k, v = (cp.shard(x).requires_grad_() for x in whole)
        del whole

        def step():
            cp.context_parallel_attention(q, k, v, strategy=strategy,
                                          is_causal=True).sum().backward()
    return measure(step, (q, k, v))


def memory_table(L: int, H: int, D: int, world: int) -> None:
    from attnlab.distributed import spawn

    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)  # read by the fresh processes

    print(f"\n## memory a causal fwd+bwd adds per rank: L={L}, B=1, H={H}, D={D}, fp32, zigzag; "
          f"1 thread per rank, gloo on loopback; load average {os.getloadavg()[0]:.1f} at the "
          f"start. RSS: VmHWM after clear_refs minus VmRSS before (glibc mmap threshold "
          f"128 KiB); tensors: the peak of live tensor bytes (TensorLedger); both after one "
          f"warm-up call, in fresh processes, the busiest rank\n")
    (single,) = spawn(_rank, 1, L, H, D, "single", timeout_s=3600)
    print("| P | strategy | RSS MiB/rank | RSS / one process | tensors MiB/rank | "
          "tensors / one process |")
    print("|---|---|---|---|---|---|")
    print(f"| 1 | attnlab.attention | {single['rss']:,.0f} | 1.00 | {single['tensors']:,.0f} "
          f"| 1.00 |", flush=True)
    for s in STRATEGIES:
        rows = spawn(_rank, world, L, H, D, s, timeout_s=3600, group_timeout_s=900)
        rss, ten = max(r["rss"] for r in rows), max(r["tensors"] for r in rows)
        print(f"| {world} | {s} | {rss:,.0f} | {rss / single['rss']:.2f} | {ten:,.0f} | "
              f"{ten / single['tensors']:.2f} |", flush=True)
