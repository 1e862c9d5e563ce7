"""Memory falls with P: a causal ring call's per-rank peak of live tensor bytes is bounded by
its shard (no second block-sized buffer for received gradients, received blocks freed once used,
one head's kernel transients at a time), and the head-by-head backward stays exact."""

import torch

from attnlab.distributed import attend, ledger
from attnlab.distributed.attend import Call
from attnlab.distributed.geometry import Geometry
from distributed.harness import run_group
from distributed.memory_cases import ring_peak, split_heads_exact


def test_ring_peak_per_rank_is_at_most_0_6_of_one_process():
    # L = 8192, H = 4, D = 64, the backward of every block head by head (as blocks of causal
    # L = 32768 run it as shipped; the threshold is lowered to keep this test small)
    per_rank = run_group(ring_peak, 2, 8192, 4, 64, 1 << 18, timeout_s=240)
    single = per_rank[0]["single"]
    for r in per_rank:
        assert r["ring"] <= 0.6 * single, (r["ring"] / 2**20, single / 2**20)
        # kept: out, dq, dk, dv (4 shards) and at most one received k, v (2 shards); the rest
        # (sent copies, one head's kernel transients) under 3 shards more
        assert r["ring"] <= 9 * r["shard"], r["ring"] / r["shard"]


def test_head_by_head_backward_is_exact_in_float64():
    (res, _) = run_group(split_heads_exact, 2, timeout_s=240)
    for case, err in res.items():
        assert err < 1e-12, (case, err)


def _call(mask=None, dropout_p=0.0):
    geom = Geometry(256, 256, 2, "zigzag", mask)
    return Call(geom, None, 0, 2, 0.125, None, torch.float32, dropout_p)


def test_head_groups_split_large_blocks_only_when_every_head_shares_the_mask():
    from attnlab import masks

    q = torch.zeros(1, 8, 4096, 64)
    rows = 4096  # 8 · 4096 · 64 elements > HEAD_SPLIT_ELEMENTS
    assert attend.head_groups(_call(masks.causal()), q, 2, 4096, rows) == [
        (slice(0, 4), slice(0, 1)), (slice(4, 8), slice(1, 2))]
    small = 2048  # 8 · 2048 · 64: one call
    assert attend.head_groups(_call(masks.causal()), q[:, :, :2048], 2, 2048, small) == [
        (slice(None),) * 2]
    per_head = masks.from_function(lambda b, h, i, j: j <= i + h, heads=8)
    assert attend.head_groups(_call(per_head), q, 2, 4096, rows) == [(slice(None),) * 2]
    assert attend.head_groups(_call(dropout_p=0.1), q, 2, 4096, rows) == [(slice(None),) * 2]


def test_ledger_counts_new_storages_not_views():
    x = torch.zeros(1024)
    with ledger.TensorLedger() as led:
        y = x[:512]  # a view: nothing
        z = torch.ones(1024) + 1  # a temporary of 4 KiB, then the result
        del y
    assert led.peak == 2 * 4096 and led.bytes == 4096
    del z
