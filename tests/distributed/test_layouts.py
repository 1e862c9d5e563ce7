"""Layouts: which global tokens each rank holds, for any L and P (L not divisible, L < P), and
the one-process path (no process group) with attnlab's semantics."""

import pytest
import torch

import attnlab
import attnlab.distributed as cp
from attnlab import masks
from attnlab.distributed.layouts import Sharding
from attnlab.errors import AttnlabError


def test_positions_by_hand():
    assert cp.positions(8, "zigzag", 0, 2).tolist() == [0, 1, 6, 7]
    assert cp.positions(8, "zigzag", 1, 2).tolist() == [2, 3, 4, 5]
    assert cp.positions(8, "contiguous", 1, 2).tolist() == [4, 5, 6, 7]
    assert cp.positions(8, "striped", 1, 3).tolist() == [1, 4, 7]
    # L = 10 over 2 ranks zigzag: chunks of 3, the last cut to 1
    assert cp.positions(10, "zigzag", 0, 2).tolist() == [0, 1, 2, 9]
    assert cp.positions(10, "zigzag", 1, 2).tolist() == [3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("layout", cp.LAYOUTS)
@pytest.mark.parametrize("L, P", [(1, 1), (7, 2), (29, 3), (37, 4), (3, 4), (1, 4), (64, 8)])
def test_every_token_on_exactly_one_rank(layout, L, P):
    got = torch.cat([cp.positions(L, layout, r, P) for r in range(P)])
    assert sorted(got.tolist()) == list(range(L))
    sh = Sharding(L, layout, P)
    assert all(sh.size(r) <= sh.n_max for r in range(P))
    order = sh.owner_order()
    assert len(set(order.tolist())) == L and int(order.max()) < P * sh.n_max


def test_l_smaller_than_p_leaves_ranks_empty():
    sizes = [len(cp.positions(3, "zigzag", r, 4)) for r in range(4)]
    assert sizes == [1, 1, 1, 0]


def test_zigzag_pairs_early_and_late_chunks():
    pos = cp.positions(16, "zigzag", 1, 4)  # chunks 1 and 6 of 2
    assert pos.tolist() == [2, 3, 12, 13]


@pytest.mark.parametrize("bad, msg", [
    (dict(layout="diagonal"), "layout"), (dict(rank=4), "rank"), (dict(world=0), "world"),
    (dict(L=-1), "L"),
])
def test_positions_rejects_bad_arguments(bad, msg):
    args = dict(L=8, layout="zigzag", rank=0, world=4)
    args.update(bad)
    with pytest.raises(AttnlabError, match=msg):
        cp.positions(**args)


def test_shard_without_a_group_is_the_whole_tensor():
    x = torch.randn(2, 3, 10, 4)
    assert torch.equal(cp.shard(x, "zigzag"), x)
    assert torch.equal(cp.unshard(x, "zigzag"), x)


# -- one process (no process group): the same semantics as attnlab.attention -----------------

STRATS = ("ring", "allgather", "ulysses")


@pytest.mark.parametrize("strategy", STRATS)
def test_one_process_equals_attention_with_gqa(strategy):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 13, 32, dtype=torch.float64, generator=g)
    k, v = (torch.randn(2, 2, 13, 32, dtype=torch.float64, generator=g) for _ in range(2))
    m = masks.sliding_window(4) | masks.prefix_lm(2)
    out, lse = cp.context_parallel_attention(q, k, v, strategy=strategy, mask=m, enable_gqa=True,
                                             return_lse=True, softcap=3.0, scale=0.3)
    ro, rl = attnlab.attention(q, k, v, mask=m, enable_gqa=True, return_lse=True, softcap=3.0,
                               scale=0.3)
    torch.testing.assert_close(out, ro, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, rl, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("strategy", STRATS)
def test_empty_rows_and_nan_in_dead_keys(strategy):
    """A padded query row gets output 0 and lse -inf; NaN in keys no query may attend does not
    leak into outputs or gradients."""
    q = torch.randn(1, 2, 6, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 6, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 6, 8, dtype=torch.float64)
    k[:, :, 4:] = float("nan")
    v[:, :, 4:] = float("inf")
    k.requires_grad_()
    v.requires_grad_()
    m = masks.padding(key_lengths=4, query_lengths=5)
    out, lse = cp.context_parallel_attention(q, k, v, strategy=strategy, mask=m, return_lse=True)
    assert torch.isfinite(out).all()
    assert (out[:, :, 5] == 0).all() and (lse[:, :, 5] == float("-inf")).all()
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (k.grad[:, :, 4:] == 0).all() and (v.grad[:, :, 4:] == 0).all()


def test_ring_lse_gradient_matches_math_backend():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 9, 16, dtype=torch.float64, generator=g).requires_grad_()
               for _ in range(3))
    out, lse = cp.context_parallel_attention(q, k, v, strategy="ring", is_causal=True,
                                             return_lse=True)
    ro, rl = attnlab.attention(q, k, v, is_causal=True, return_lse=True, backend="math")
    a = torch.autograd.grad(out.sum() + lse.sum(), (q, k, v))
    b = torch.autograd.grad(ro.sum() + rl.sum(), (q, k, v))
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bad, msg", [
    (dict(strategy="tree"), "strategy"),
    (dict(layout="diagonal"), "layout"),
    (dict(is_causal=1), "is_causal"),
    (dict(mask=torch.ones(4, 4, dtype=torch.bool)), "mask"),
    (dict(softcap=-1.0), "softcap"),
])
def test_bad_arguments_raise_attnlab_error(bad, msg):
    x = torch.randn(1, 2, 4, 8)
    with pytest.raises(AttnlabError, match=msg):
        cp.context_parallel_attention(x, x, x, **bad)


def test_three_dim_input_is_rejected():
    x = torch.randn(2, 4, 8)
    with pytest.raises(AttnlabError, match=r"query: expected a 4-D tensor"):
        cp.context_parallel_attention(x, x, x)
