"""The cost model on paper: load balance from the mask's tiles, halos, exact mask-aware transfer
sets, messages and their latency, feasibility, and the `attnlab plan-cp` table. (That the bytes
and messages equal what the code sends is asserted against the running group in test_comm.py.)"""

import pytest
import torch

import attnlab.distributed as cp
from attnlab import masks
from attnlab.cli import main
from attnlab.distributed.geometry import Geometry
from attnlab.errors import AttnlabError


@pytest.mark.parametrize("P", [4, 8])
def test_zigzag_balances_causal_work(P):
    p = cp.plan(4096, 8, 8, 64, P, mask=masks.causal(), layout="zigzag")
    assert p["ring"].load <= 1.05
    c = cp.plan(4096, 8, 8, 64, P, mask=masks.causal(), layout="contiguous")
    assert c["ring"].load == pytest.approx((2 * P - 1) / P, rel=1e-3)


def test_flops_of_a_full_square():
    p = cp.plan(1024, 4, 4, 64, 4, layout="contiguous", dtype="fp32")
    assert sum(p["ring"].flops_fwd) == 4 * 4 * 1024 * 1024 * 64  # 4·H·L·S·D


def test_sliding_window_ring_and_allgather_move_only_halos():
    W, L, P = 64, 4096, 4
    p = cp.plan(L, 1, 1, 32, P, mask=masks.sliding_window(W), layout="contiguous",
                dtype=torch.float64)
    row = 1 * 1 * (32 + 32) * 8
    for s in ("ring", "allgather"):
        assert p[s].fwd_recv == [0] + [(W - 1) * row] * (P - 1)  # not a shard of 1024
        assert p[s].fwd_sent == [(W - 1) * row] * (P - 1) + [0]
        assert p[s].fwd_msgs_recv == [0, 2, 2, 2]  # k and v from the left neighbour
    assert p.choice == "ring"  # the same bytes, overlapped with compute


def test_documents_within_shards_need_no_transfer():
    ids = torch.arange(64) // 16  # 4 documents, one per contiguous shard
    p = cp.plan(64, 4, 4, 32, 4, mask=masks.document(ids), layout="contiguous")
    assert p["allgather"].fwd_sent == [0] * 4 and p["ring"].fwd_sent == [0] * 4
    ids = torch.tensor([0] * 20 + [1] * 44)  # document 0 crosses into rank 1's shard
    g = Geometry(64, 64, 4, "contiguous", masks.document(ids))
    assert g.counts[1][0] == 16 and g.counts[0][1] == 4 and g.counts[2][0] == 0


@pytest.mark.parametrize("layout", cp.LAYOUTS)
@pytest.mark.parametrize("L, P", [(29, 3), (37, 4), (3, 4), (100, 8)])
def test_transfer_sets_are_exact(layout, L, P):
    """Rank r receives exactly the keys of rank s that some query of r may attend: no more (for
    striped layouts and `&` / `|` masks too, whose tiles are conservative), no fewer."""
    for m in (None, masks.causal(), masks.sliding_window(5),
              masks.document(torch.arange(L) // 7) & masks.causal(),
              masks.padding(key_lengths=[L // 2, L - 1]),
              (masks.sliding_window(4) | masks.prefix_lm(2)) & masks.padding(key_lengths=L - 2),
              masks.sliding_window(3) & ~masks.causal()):
        g = Geometry(L, L, P, layout, m)
        dense = None if m is None else m.to_dense(L, L).flatten(0, 1).any(0)
        for r in range(P):
            for s in range(P):
                rows = g.rows_needed(r, s)
                assert g.counts[r][s] == len(rows)
                if r == s or not g.q.size(r):
                    continue
                need = torch.ones(g.k.size(s), dtype=torch.bool) if dense is None else \
                    dense[g.q.positions(r)][:, g.k.positions(s)].any(0)
                got = torch.zeros_like(need)
                got[rows] = True
                assert torch.equal(need, got), (m, r, s)


def test_striped_causal_sends_no_key_past_a_ranks_last_query():
    """Striped, L = 37 over 4: rank 1's queries are 1, 5, ..., 33, so it needs rank 0's keys
    0, 4, ..., 32 (9 of 10) and none of the 36; rank 0 (up to query 36) needs all of everyone's."""
    g = Geometry(37, 37, 4, "striped", masks.causal())
    assert g.counts[1][0] == 9 and g.counts[0][1] == 9 and g.counts[0][3] == 9
    assert g.counts[3][0] == 9 and g.counts[2][3] == 8  # rank 3's keys 3..31 below query 34


def test_latency_adds_messages_times_latency_to_the_time():
    """Contiguous causal over 4: rank 3 receives k and v from 3 ranks forward and again backward
    and sends 3 partials back: 6 messages out, 12 in over both passes (the busiest)."""
    kw = dict(mask=masks.causal(), layout="contiguous", dtype=torch.float64)
    slow = cp.plan(4096, 1, 1, 32, 4, latency_us=100.0, **kw)["ring"]
    fast = cp.plan(4096, 1, 1, 32, 4, latency_us=0.0, **kw)["ring"]
    assert slow.fwd_msgs_recv == [0, 2, 4, 6] and slow.fwd_msgs_sent == [6, 4, 2, 0]
    assert slow.bwd_msgs_sent == [6, 6, 6, 6] and slow.bwd_msgs_recv == [6, 6, 6, 6]
    assert slow.latency_s == pytest.approx(12 * 100e-6)
    assert slow.comm_s - fast.comm_s == pytest.approx(12 * 100e-6)
    row = 1 * 1 * (32 + 32) * 8  # rank 3 receives 3 shards of 1024 keys, twice
    assert fast.comm_s == pytest.approx(2 * 3 * 1024 * row / (100e9 / 8))
    assert slow.serial_s == pytest.approx(slow.comm_s + slow.compute_s)
    assert slow.time_s == pytest.approx(max(slow.comm_s, slow.compute_s))


def test_ulysses_needs_divisible_heads():
    p = cp.plan(1024, 6, 3, 64, 4)
    assert not p["ulysses"].feasible and "H = 6" in p["ulysses"].why_not
    assert p.choice in ("ring", "allgather")


@pytest.mark.parametrize("H, Hkv, P, K", [(8, 8, 4, 8), (8, 2, 4, 4), (4, 1, 4, 4),
                                          (12, 3, 4, 12), (6, 2, 3, 6), (32, 8, 16, 16)])
def test_ulysses_replicates_kv_heads_to_lcm(H, Hkv, P, K):
    """K/V travel with lcm(Hkv, P) heads: as many as there are when P divides Hkv, else copies
    so that each rank gets whole heads; the bytes are q's, out's and lse's plus K heads of k, v."""
    from attnlab.distributed.headrule import ulysses_kv_heads

    assert ulysses_kv_heads(Hkv, P) == K
    L, D = 64 * P, 32
    e = cp.plan(L, H, Hkv, D, P, layout="contiguous", dtype="fp32")["ulysses"]
    n = L // P
    tensors = [H * n * D, K * n * D, K * n * D, H * n * D, H * n]  # q, k, v, out, lse (x4 B)
    assert e.feasible and e.fwd_sent == [sum((P - 1) * 4 * t // P for t in tensors)] * P


def test_explain_names_the_pick_and_the_others():
    ch = cp.explain(4096, 8, 8, 64, 4, mask=masks.sliding_window(64), layout="contiguous")
    assert ch.strategy == "ring"
    assert "ring" in ch.reason and "ulysses" in ch.reason and "MiB" in ch.reason


@pytest.mark.parametrize("kw, msg", [
    (dict(dtype="int8"), "dtype"), (dict(link_gbps=0), "link_gbps"), (dict(layout="x"), "layout"),
    (dict(latency_us=-1), "latency_us"), (dict(latency_us=float("nan")), "latency_us"),
])
def test_plan_rejects_bad_arguments(kw, msg):
    with pytest.raises(AttnlabError, match=msg):
        cp.plan(64, 4, 4, 32, 2, **kw)
    with pytest.raises(AttnlabError, match="Hkv"):
        cp.plan(64, 4, 3, 32, 2)


def test_cli_plan_cp_table(capsys):
    assert main(["plan-cp", "--L", "65536", "--num-heads", "32", "--num-kv-heads", "8",
                 "--head-dim", "128", "--world", "8", "16", "--mask", "sliding:4096"]) == 0
    out = capsys.readouterr().out
    assert "| 8 | ring |" in out and "| 16 | allgather |" in out and "**auto**" in out
    # 8 key/value heads replicated to 16, one a rank: (q 32 + k, v 16 + 16 + out 32 + lse 0.5)
    # MiB x 15/16
    assert "| 16 | ulysses | 90.5 |" in out
    assert "10 µs per message" in out


def test_cli_plan_cp_latency_flag(capsys):
    import json

    args = ["plan-cp", "--L", "4096", "--num-heads", "8", "--world", "4", "--json"]
    assert main([*args, "--latency-us", "0"]) == 0
    (zero,) = json.loads(capsys.readouterr().out)
    assert main([*args, "--latency-us", "50"]) == 0
    (fifty,) = json.loads(capsys.readouterr().out)
    ring0, ring50 = zero["strategies"]["ring"], fifty["strategies"]["ring"]
    msgs = max(max(a + b, c + d) for a, b, c, d in zip(
        ring0["fwd_msgs_sent"], ring0["bwd_msgs_sent"], ring0["fwd_msgs_recv"],
        ring0["bwd_msgs_recv"]))
    assert ring0["latency_s"] == 0 and ring50["latency_s"] == pytest.approx(msgs * 50e-6)


def test_cli_plan_cp_json_matches_plan(capsys):
    assert main(["plan-cp", "--L", "4096", "--num-heads", "8", "--world", "4", "--mask",
                 "document:3", "--dtype", "fp32", "--json"]) == 0
    import json

    (got,) = json.loads(capsys.readouterr().out)
    ids = torch.arange(4096) * 3 // 4096
    want = cp.plan(4096, 8, 8, 128, 4, mask=masks.document(ids), is_causal=True,
                   dtype="fp32")
    assert got["choice"] == want.choice
    assert got["strategies"]["ring"]["fwd_sent"] == want["ring"].fwd_sent


def test_cli_plan_cp_bad_mask(capsys):
    assert main(["plan-cp", "--L", "64", "--num-heads", "4", "--mask", "sliding:x"]) == 2
    assert "--mask" in capsys.readouterr().err


def test_near_ties_go_to_the_strategy_that_sends_less():
    from attnlab.distributed.cost import Estimate, choose

    def est(name, compute, comm, sent, overlaps):
        return Estimate(name, True, "", [sent], [sent], [0], [0], [1.0], comm, compute, overlaps)

    ring = est("ring", 1.0, 0.5, 10**9, True)  # 1.0 s predicted
    gather = est("allgather", 1.0, 0.02, 10**6, False)  # 1.02 s, a thousandth of the bytes
    pick = choose({"ring": ring, "allgather": gather})
    assert pick.strategy == "allgather"
    assert "within 5% of the fastest and sends the fewest bytes" in pick.reason
    assert "fewest bytes" not in choose({"ring": ring}).reason
    slow = est("allgather", 1.0, 0.2, 10**6, False)  # 1.2 s: no longer a tie
    assert choose({"ring": ring, "allgather": slow}).strategy == "ring"


def test_hybrid_bytes_are_ulysses_in_groups_plus_the_ring_across():
    """P = 4 in 2 groups of U = 2, no mask, contiguous, L = 256, H = Hkv = 4, D = 32, fp32: the
    all-to-alls move half of q, k, v, out and lse of a 64-token shard inside the group; the ring
    brings the other group's 128 keys for this rank's 2 heads."""
    p = cp.plan(256, 4, 4, 32, 4, layout="contiguous", dtype="fp32", ulysses_size=2)
    a2a = (4 * (4 * 64 * 32 * 4) + 4 * 64 * 4) // 2
    ring = 128 * 2 * (32 + 32) * 4
    h = p["hybrid"]
    assert h.feasible and h.fwd_sent == [a2a + ring] * 4 and h.fwd_recv == [a2a + ring] * 4
    assert h.fwd_msgs_sent == [4 * 1 + 2] * 4  # 4 all-to-alls with 1 peer; k and v to 1 peer
    assert "hybrid" not in cp.plan(256, 4, 4, 32, 4).estimates  # only when U is given


def test_hybrid_two_link_tiers():
    """A fast link inside groups and a slow one between them: only the ring crosses the slow
    one, so the hybrid's predicted time falls with intra_gbps and the others' do not."""
    kw = dict(mask=masks.causal(), dtype="bf16", ulysses_size=8, inter_gbps=100)
    slow = cp.plan(1 << 17, 32, 8, 128, 32, intra_gbps=100, **kw)
    fast = cp.plan(1 << 17, 32, 8, 128, 32, intra_gbps=3600, **kw)
    assert fast["hybrid"].comm_s < slow["hybrid"].comm_s
    assert fast["hybrid"].a2a_s < slow["hybrid"].a2a_s
    for s in ("ring", "allgather", "ulysses"):
        assert fast[s].comm_s == slow[s].comm_s
    assert fast["hybrid"].time_s == pytest.approx(
        fast["hybrid"].a2a_s + max(fast["hybrid"].comm_s - fast["hybrid"].a2a_s,
                                   fast["hybrid"].compute_s))


@pytest.mark.parametrize("U, msg", [(3, "dividing world = 4, got 3"), (0, "got 0")])
def test_hybrid_infeasible_names_the_rule(U, msg):
    p = cp.plan(256, 4, 4, 32, 4, ulysses_size=U)
    assert not p["hybrid"].feasible and msg in p["hybrid"].why_not
    q = cp.plan(256, 6, 3, 32, 4, ulysses_size=4)
    assert "H = 6 divisible by ulysses_size U = 4" in q["hybrid"].why_not


def test_cli_plan_cp_hybrid_tiers(capsys):
    assert main(["plan-cp", "--L", "131072", "--num-heads", "32", "--num-kv-heads", "8", "--world",
                 "32", "--ulysses-size", "8", "--intra-gbps", "3600", "--inter-gbps",
                 "400"]) == 0
    out = capsys.readouterr().out
    assert "3600 Gbit/s inside groups of 8, 400 Gbit/s between" in out
    assert "| 32 | hybrid |" in out
