"""Context-parallel attention: one sequence split over the P ranks of a torch.distributed group,
the same answer as on one process, forward and backward.

    >>> import attnlab.distributed as cp                              # doctest: +SKIP
    >>> h = cp.init(layout="zigzag")                                  # under torchrun
    >>> q, k, v = h.shard(q), h.shard(k), h.shard(v)                  # (B, H, L/P, D)
    >>> out = h.attention(q, k, v, is_causal=True)                    # this rank's rows
    >>> cp.plan(1 << 20, 32, 8, 128, 64, mask=masks.causal()).choice  # on paper

Strategies: "ring" (each rank's keys go straight to the ranks that need them, one ring distance
at a time, overlapped with compute), "allgather" (fetch once), "ulysses" (all-to-all to head
shards; K/V heads replicated when fewer than the ranks), "hybrid" (`ulysses_size=U`: all-to-all
inside groups of U ranks, ring across groups). Masks are global; empty (query, key) pairs are
never computed, unneeded keys never sent.

`calibrate(group)` measures the link, latency and compute the cost model plans with (`plan(...,
calibration=)`, `context_parallel_attention(..., calibration=)`).

Packed sequences: `varlen_attention(q, k, v, cu_seqlens)` on `varlen_shard` rows (each document
split head and tail over the ranks), planned by `varlen_plan`.

`spawn(fn, P, ...)` runs fn on P local gloo processes (tests, benchmarks, trying it out).

Caution: every rank must make the same call (checked: a mismatch is an AttnlabError on every
rank) and, when gradients are needed, run the backward. Per-head masks do not go with "ulysses".

Files (`docs/develop.md` says which a change touches):

- planning, the same on every rank and before anything runs: layouts.py (which global tokens a
  rank holds), geometry.py (which (query, key) pieces the mask leaves anything in, which key rows
  each rank needs from each other), blockmask.py (a global mask seen from one block), pairs.py
  (a block's pairs with something to attend), headrule.py (Ulysses' head split), grouped.py
  (hybrid's groups as the ring sees them), cost.py and blockcost.py (bytes, FLOPs and time of
  each strategy; `plan`, "auto"), calibrate.py (the link and compute rates the model uses),
  validate.py (every rank makes the same call);
- running, this rank's arithmetic: api.py (the public functions and the handle a model gets),
  ring.py, gather.py, ulysses.py, hybrid.py, varlen.py (the strategies and packed sequences),
  attend.py (one key block against this rank's queries, shared by ring and all-gather, and the
  strategies' autograd Function), kernel_block.py (a block as whole interval-kernel calls),
  blocks.py (a pair's backward, dropout), keyed.py (keyed dropout), ledger.py (live tensor bytes,
  for the memory tests);
- wire: comm.py, the only file that calls torch.distributed (every collective with what travels
  and its size, a timeout on every wait, the record `record()` returns), spawn.py (P local gloo
  processes for tests and benchmarks).
"""

from attnlab.distributed.api import (
    ContextParallel,
    context_parallel_attention,
    init,
    shard,
    unshard,
)
from attnlab.distributed.calibrate import Calibration, calibrate
from attnlab.distributed.comm import CommLog, record
from attnlab.distributed.cost import Estimate, Plan, StrategyChoice, explain, plan
from attnlab.distributed.hybrid import hybrid_groups
from attnlab.distributed.layouts import LAYOUTS, positions
from attnlab.distributed.spawn import SpawnError, spawn
from attnlab.distributed.varlen import varlen_attention, varlen_plan, varlen_shard, varlen_unshard

__all__ = [
    "LAYOUTS",
    "Calibration",
    "CommLog",
    "ContextParallel",
    "Estimate",
    "Plan",
    "SpawnError",
    "StrategyChoice",
    "calibrate",
    "context_parallel_attention",
    "explain",
    "hybrid_groups",
    "init",
    "plan",
    "positions",
    "record",
    "shard",
    "spawn",
    "unshard",
    "varlen_attention",
    "varlen_plan",
    "varlen_shard",
    "varlen_unshard",
]
