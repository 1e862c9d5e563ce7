"""The one harness of the distributed tests: spawned groups and their subgroups, the masks the
cases use (on global positions), and the relative error every case reports.

Case modules (cases.py, lse_cases.py, dropout_cases.py, ulysses_lse_cases.py, nonfinite_cases.py,
...) hold only what their cases compute; they run on every rank of a group that
`run_group` spawns through `attnlab.distributed.spawn`: every group has a timeout and so does the
wait, so a test never hangs, and the first rank that fails is the error. The functions they run
must live in an importable module (this folder is on the path as `distributed`), as spawned
children import them by name.
"""

from __future__ import annotations

import datetime
import math

import torch

from attnlab import masks
from attnlab.distributed import spawn

GROUP_TIMEOUT_S = 30.0

#: every mask kind a case can name; make_mask builds it for a given L and B
MASK_KINDS = ("none", "causal", "sliding", "sliding64", "document", "document3", "docshard",
              "padding", "prefix", "combo", "window_or_prefix", "not_window", "window_and_doc",
              "window", "block_causal", "block_diagonal", "ragged_causal", "function",
              "function_bh")


def subgroups(world: int, timeout_s: float = GROUP_TIMEOUT_S, smallest: int = 1):
    """{P: group of ranks 0..P-1} for P = smallest..world (every rank must call new_group)."""
    import torch.distributed as dist

    t = datetime.timedelta(seconds=timeout_s)
    out = {P: dist.new_group(list(range(P)), timeout=t) for P in range(smallest, world)}
    out[world] = dist.group.WORLD
    return out


def run_group(fn, world: int, *args, timeout_s: float = 150.0,
              group_timeout_s: float = GROUP_TIMEOUT_S) -> list:
    """[fn(rank, world, *args) for each rank], run on `world` spawned processes."""
    return spawn(fn, world, *args, timeout_s=timeout_s, group_timeout_s=group_timeout_s)


def results_by_case(fn, world: int, group_timeout_s: float, timeout_s: float = 240.0) -> dict:
    """{case id: [each rank's result]} of a worker `fn` that returns {case id: result}."""
    out: dict = {}
    for per_rank in run_group(fn, world, timeout_s=timeout_s, group_timeout_s=group_timeout_s):
        for cid, res in per_rank.items():
            out.setdefault(cid, []).append(res)
    return out


def case_ranks(case, results) -> list:
    """Every rank's result of `case`, each checked to hold no error."""
    per_rank = results[case["id"]]
    assert len(per_rank) == case["P"]
    for rank, r in enumerate(per_rank):
        assert "error" not in r, f"rank {rank}:\n{r.get('error')}"
    return per_rank


def run_each(cases, run_case, groups, rank: int) -> dict:
    """{case id: run_case(case, group)} of every case that includes this rank. A case that raises
    stops this rank at once, naming the case (`spawn` then stops the group and reports this
    rank's traceback): going on to the next case would leave the peers waiting in this case's
    transfers until the group's timeout, or pair their transfers with the next case's."""
    out = {}
    for c in cases:
        if rank < c["P"]:
            try:
                out[c["id"]] = run_case(c, groups[c["P"]])
            except Exception as e:
                raise RuntimeError(f"case {c['id']} failed on rank {rank}: "
                                   f"{type(e).__name__}: {e}"[:2000]) from e
    return out


def make_mask(kind: str, L: int, B: int = 2):
    """(mask, is_causal) in global positions; documents cross shard boundaries."""
    if kind == "none":
        return None, False
    if kind == "causal":
        return None, True
    if kind == "sliding":
        return masks.sliding_window(5), False
    if kind == "sliding64":
        return masks.sliding_window(64), False
    if kind == "document":
        ids = torch.tensor([0] * (L // 3) + [1] * (L // 4) + [2] * (L - L // 3 - L // 4))
        return masks.document(ids), True
    if kind == "document3":  # three equal documents
        return masks.document(torch.arange(L) * 3 // L), True
    if kind == "docshard":  # L = 37 over 4 contiguous shards of 10: rank 0 shares no document
        ids = torch.tensor([0] * 10 + [1] * 15 + [2] * (L - 25))
        return masks.document(ids), True
    if kind == "padding":  # batch 1 pads queries: rows that attend nothing
        kl, ql = [L - 3, max(L // 2, 1)][:B], [L, max(L - 7, 1)][:B]
        return masks.padding(key_lengths=kl, query_lengths=ql), False
    if kind == "prefix":
        return masks.prefix_lm(min(7, L)), False
    if kind == "combo":  # a window plus global first tokens, outside a padded tail
        return (masks.sliding_window(4) | masks.prefix_lm(2)) & masks.padding(key_lengths=L - 2), \
            False
    if kind == "window_or_prefix":  # a wide window plus global first tokens: PARTIAL tiles
        return masks.sliding_window(40) | masks.prefix_lm(19), True
    if kind == "not_window":  # everything but a band, under causal
        return ~masks.sliding_window(9), True
    if kind == "window_and_doc":
        return masks.sliding_window(33) & masks.document(torch.arange(L) * 3 // L), False
    if kind == "window":  # two-sided band
        return masks.window(3, 2), False
    if kind == "block_causal":  # packed sequences that cross shard boundaries
        return masks.block_causal([L // 3, L // 4, L - L // 3 - L // 4]), False
    if kind == "block_diagonal":  # packed sequences, a window on each one's own diagonal
        return masks.block_diagonal([L // 2, L - L // 2], left=4, right=1), False
    if kind == "ragged_causal":  # each batch element causal on its own real lengths
        return masks.ragged_causal(query_lengths=[L, L - 3][:B],
                                   key_lengths=[L, L - 5][:B]), False
    if kind == "function":  # a sliding window of 5 as a function: a new lambda on every rank
        return masks.from_function(lambda b, h, q, k: (q - k >= 0) & (q - k < 5)), False
    if kind == "function_bh":  # a per-head window width (h + 2) as a function
        heads_ = 4
        return masks.from_function(lambda b, h, q, k: (q >= k) & (q - k < h + 2),
                                   heads=heads_), False
    raise ValueError(kind)


def ref_scale(full) -> float:
    """The largest finite |entry| of a reference tensor (1.0 if it has none), or `full` itself
    when it is already a number."""
    if not isinstance(full, torch.Tensor):
        return float(full)
    fin = full.detach().double()
    fin = fin[torch.isfinite(fin)].abs()
    return float(fin.max()) if fin.numel() else 1.0


def rel(a: torch.Tensor, b: torch.Tensor, full=None) -> float:
    """max |a − b| relative to the largest finite entry of `full` (a tensor, the whole reference:
    a shard's own maximum can be 0, rank 0's dq under a causal mask; or a number; None: b).
    Equal infinities count as 0, NaN as inf."""
    scale = ref_scale(b if full is None else full)
    a, b = a.detach().double(), b.detach().double()
    both_inf = torch.isinf(a) & torch.isinf(b) & (a == b)
    d = torch.where(both_inf, torch.zeros_like(a), (a - b).abs())
    d = torch.nan_to_num(d, nan=math.inf)
    return float(d.max()) / max(scale, 1e-300) if d.numel() else 0.0


def same_nonfinite(a: torch.Tensor, b: torch.Tensor) -> tuple[int, float]:
    """(entries where a and b differ in NaN / ±inf, max |a − b| relative to b's largest finite
    entry over the entries finite in both): what a run with NaN/Inf inputs compares."""
    a, b = a.detach().double(), b.detach().double()
    ok = (torch.isnan(a) & torch.isnan(b)) | (torch.isinf(a) & (a == b)) \
        | (torch.isfinite(a) & torch.isfinite(b))
    pattern = ~ok
    both = torch.isfinite(a) & torch.isfinite(b)
    d = (a - b).abs()[both]
    return int(pattern.sum()), (float(d.max()) / max(ref_scale(b), 1e-300) if d.numel() else 0.0)
