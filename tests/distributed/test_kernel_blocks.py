"""A key block as whole interval-kernel calls (`distributed.kernel_block`): every block a ring
rank computes, on every layout, agrees with the (query piece, key piece) pair loop — out, lse,
dq, dk, dv, with and without writing the gradients over a received block, head by head and in
tiles — and takes fewer kernel calls; blocks the spans cannot take fall back to the pair loop."""

import pytest
import torch

from attnlab import masks
from attnlab.distributed import attend, kernel_block
from attnlab.distributed.attend import Call
from attnlab.distributed.geometry import Geometry
from attnlab.ops import kernels
from interval_cases import need_compiler

from helpers import assert_close

B, H, Hkv, D = 2, 4, 2, 16


@pytest.fixture(autouse=True)
def _kernel():
    need_compiler()
    if not kernels.available():
        pytest.skip("the interval kernel is not available")


def _mask(kind: str, L: int):
    return {
        "none": None,
        "causal": masks.causal(),
        "window": masks.sliding_window(37),
        "document": masks.document(torch.arange(L) // 70),
        "padded_causal": masks.causal() & masks.padding(torch.tensor([L, L - 45])),
        "window_document": masks.sliding_window(50) & masks.document(torch.arange(L) // 90),
    }[kind]


def _inputs(L, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, D, generator=g), torch.randn(B, Hkv, L, D, generator=g),
            torch.randn(B, Hkv, L, D, generator=g))


def _blocks(g: Geometry, r: int, k, v):
    """[(k block, v block, pieces)] of rank r in ring order: its own shard, then each source's
    rows that r needs, as the ring sends them."""
    out = []
    for s in [r] + [(r - t) % g.world for t in range(1, g.world)]:
        ks, vs = (x[:, :, g.k.positions(s)] for x in (k, v))
        if s == r:
            out.append((ks, vs, g.k.pieces(r)))
        elif g.count_needed(r, s):
            rows = g.rows_needed(r, s)
            out.append((ks[:, :, rows], vs[:, :, rows], g.received_pieces(r, s)))
    return out


def _rank(g: Geometry, r: int, spans: bool, monkeypatch, reuse: bool, seed=0):
    """(out, lse, dq, [(dk, dv) per block]) of rank r's blocks, spans on or off."""
    monkeypatch.setattr(kernel_block, "ENABLED", spans)
    q, k, v = _inputs(g.L, seed)
    c = Call(g, None, r, g.world, D ** -0.5, None, torch.float32)
    q_r = q[:, :, g.q.positions(r)].contiguous()
    state = attend.start_state(c, q_r, D)
    for kb, vb, pieces in _blocks(g, r, k, v):
        assert spans == (kernel_block.spans(c, q_r, kb, vb, pieces) is not None)
        attend.forward_block(c, state, q_r, kb, vb, pieces)
    gen = torch.Generator().manual_seed(seed + 1)
    dout = torch.randn(state.ready().out.shape, generator=gen)
    dlse = torch.randn(state.lse.shape, generator=gen)
    saved = (q_r, state.out, state.lse, dout, dlse)
    dq = torch.zeros_like(q_r)
    grads = []
    for i, (kb, vb, pieces) in enumerate(_blocks(g, r, k, v)):
        grads.append(tuple(x.clone() for x in attend.backward_block(
            c, saved, dq, kb.clone(), vb.clone(), pieces, reuse=reuse and i > 0)))
    return state.out, state.lse, dq, grads


def _same(a, b):
    out_a, lse_a, dq_a, g_a = a
    out_b, lse_b, dq_b, g_b = b
    assert_close(out_a, out_b, atol=2e-5, rtol=1e-4)
    assert torch.equal(torch.isinf(lse_a), torch.isinf(lse_b))
    live = torch.isfinite(lse_b)
    assert_close(lse_a[live], lse_b[live], atol=2e-5, rtol=1e-5)
    assert_close(dq_a, dq_b, atol=5e-5, rtol=1e-4)
    assert len(g_a) == len(g_b)
    for (dk_a, dv_a), (dk_b, dv_b) in zip(g_a, g_b):
        assert_close(dk_a, dk_b, atol=5e-5, rtol=1e-4)
        assert_close(dv_a, dv_b, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous", "striped"])
@pytest.mark.parametrize("kind", ["none", "causal", "window", "document", "padded_causal",
                                  "window_document"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_spans_agree_with_the_pair_loop(layout, kind, world, monkeypatch):
    L = 301
    g = Geometry(L, L, world, layout, _mask(kind, L))
    for r in range(world):
        _same(_rank(g, r, True, monkeypatch, reuse=True),
              _rank(g, r, False, monkeypatch, reuse=True))


@pytest.mark.parametrize("kind", ["causal", "window", "document"])
def test_head_by_head_tiles_agree_with_the_pair_loop(kind, monkeypatch):
    """Every block split by heads and cut in tiles of one chunk (the chunk 64 < a span)."""
    monkeypatch.setattr(attend, "HEAD_SPLIT_ELEMENTS", 0)
    L = 512
    g = Geometry(L, L, 4, "zigzag", _mask(kind, L))
    for r in (0, 3):
        for reuse in (True, False):
            _same(_rank(g, r, True, monkeypatch, reuse), _rank(g, r, False, monkeypatch, reuse))


def test_tiles_cover_each_span_once():
    lo = torch.tensor([[[0, 0, 5, 9, 20, 20]]], dtype=torch.int32)
    hi = torch.tensor([[[3, 12, 15, 9, 25, 20]]], dtype=torch.int32)
    s = kernel_block.Span(10, 40, 7, 13, lo, hi)
    cells = torch.zeros(6, 30, dtype=torch.int64)
    for a, b, parts in kernel_block.tiles(s, 8):
        assert b - a <= 8
        for t in parts:
            assert (t.a, t.b) == (a, b) and t.r1 - t.r0 <= 8
            for i in range(t.r1 - t.r0):
                x, y = int(t.lo[0, 0, i]), int(t.hi[0, 0, i])
                cells[t.r0 - 7 + i, a - 10 + x:a - 10 + y] += 1
    want = torch.zeros(6, 30, dtype=torch.int64)
    for i in range(6):
        want[i, int(lo[0, 0, i]):max(int(lo[0, 0, i]), int(hi[0, 0, i]))] = 1
    assert torch.equal(cells, want)


def _count_calls(monkeypatch):
    calls = {"fwd": 0, "bwd": 0}
    fwd, bwd = kernels.interval_forward, kernels.interval_backward

    def f(*a, **k):
        calls["fwd"] += 1
        return fwd(*a, **k)

    def b(*a, **k):
        calls["bwd"] += 1
        return bwd(*a, **k)

    monkeypatch.setattr(kernels, "interval_forward", f)
    monkeypatch.setattr(kernels, "interval_backward", b)
    return calls


def test_a_zigzag_shard_is_one_call_per_block(monkeypatch):
    """Causal, zigzag, P = 2, rank 0: its own block (chunks 0 and 3: 3 pairs) and the block of
    rank 1 (chunks 1 and 2 against chunk 3's rows: 2 pairs) are one kernel call each way."""
    calls = _count_calls(monkeypatch)
    g = Geometry(512, 512, 2, "zigzag", masks.causal())
    _rank(g, 0, True, monkeypatch, reuse=True)
    assert calls == {"fwd": 2, "bwd": 2}


def test_one_rank_makes_one_processs_call(monkeypatch):
    calls = _count_calls(monkeypatch)
    _rank(Geometry(400, 400, 1, "zigzag", masks.sliding_window(30)), 0, True, monkeypatch, True)
    assert calls == {"fwd": 1, "bwd": 1}


def test_poisoned_keys_float64_and_dropout_take_the_pair_loop():
    L = 128
    g = Geometry(L, L, 2, "zigzag", masks.causal())
    q, k, v = _inputs(L)
    c = Call(g, None, 0, 2, 0.25, None, torch.float32)
    q0 = q[:, :, g.q.positions(0)]
    k0, v0 = k[:, :, g.k.positions(0)], v[:, :, g.k.positions(0)]
    pieces = g.k.pieces(0)
    assert kernel_block.spans(c, q0, k0, v0, pieces) is not None
    bad = k0.clone()
    bad[1, 0, 5, 3] = float("nan")
    assert kernel_block.spans(Call(g, None, 0, 2, 0.25, None, torch.float32), q0, bad, v0,
                              pieces) is None
    c64 = Call(g, None, 0, 2, 0.25, None, torch.float64)
    assert kernel_block.spans(c64, q0.double(), k0.double(), v0.double(), pieces) is None
    drop = Call(g, None, 0, 2, 0.25, None, torch.float32, dropout_p=0.1)
    assert kernel_block.spans(drop, q0, k0, v0, pieces) is None
    not_intervals = Geometry(L, L, 2, "zigzag", ~masks.sliding_window(9))
    c_not = Call(not_intervals, None, 0, 2, 0.25, None, torch.float32)
    assert kernel_block.spans(c_not, q0, k0, v0, pieces) is None


def test_a_block_whose_positions_do_not_ascend_runs_in_one_call_per_run(monkeypatch):
    """An all-gathered zigzag block holds chunks 0, 3 then 1, 2: two runs, two calls."""
    calls = _count_calls(monkeypatch)
    L = 256
    g = Geometry(L, L, 2, "zigzag", masks.causal())
    q, k, v = _inputs(L)
    c = Call(g, None, 0, 2, 0.25, None, torch.float32)
    q0 = q[:, :, g.q.positions(0)]
    from attnlab.distributed.layouts import Piece

    p0, p1 = g.k.pieces(0), g.k.pieces(1)
    n0 = sum(p.length for p in p0)
    pieces = p0 + [Piece(n0 + p.start, p.length, p.positions, p.chunk) for p in p1]
    order = torch.cat([g.k.positions(0), g.k.positions(1)])
    block = kernel_block.spans(c, q0, k[:, :, order], v[:, :, order], pieces)
    assert [(s.a, s.b) for s in block] == [(0, 128), (128, 256)]
    state = attend.start_state(c, q0, D)
    kernel_block.forward(c, state, q0, k[:, :, order], v[:, :, order], block)
    assert calls["fwd"] == 2
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1),
        is_causal=True, scale=0.25)[:, :, g.q.positions(0)]
    assert_close(state.out.double(), ref, atol=1e-5, rtol=1e-5)


def test_pairs_are_logged_as_the_pair_loop_logs_them_call_after_call(monkeypatch):
    """`comm.record()` counts the same block pairs whether a block runs as spans or pair by
    pair, on the first call of a signature and on the next (whose count is replayed)."""
    import attnlab.distributed as cp
    from attnlab.distributed import comm

    L = 300
    q, k, v = _inputs(L)
    m = masks.sliding_window(40)

    def logged():
        with comm.record() as log:
            cp.context_parallel_attention(q, k, v, mask=m, strategy="ring", enable_gqa=True)
        return log.pairs

    first, second = logged(), logged()
    monkeypatch.setattr(kernel_block, "ENABLED", False)
    assert first == second == logged() and len(first) == 3  # zigzag P = 1: 2 diagonals + band


@pytest.mark.parametrize("split", [False, True])
def test_a_block_in_two_parts_of_heads_adds_up_to_the_whole(split, monkeypatch):
    """The ring's own block in two parts of the key/value heads, the second added onto what
    arrived in between, gives the whole block's gradients (head by head and in tiles too)."""
    if split:
        monkeypatch.setattr(attend, "HEAD_SPLIT_ELEMENTS", 0)
    L = 300
    g = Geometry(L, L, 2, "zigzag", masks.sliding_window(60))
    q, k, v = _inputs(L)
    c = Call(g, None, 0, 2, D ** -0.5, None, torch.float32)
    q0, k0, v0 = (x[:, :, g.q.positions(0)].contiguous() for x in (q, k, v))
    own = g.k.pieces(0)
    state = attend.start_state(c, q0, D)
    attend.forward_block(c, state, q0, k0, v0, own)
    gen = torch.Generator().manual_seed(3)
    saved = (q0, state.out, state.lse, torch.randn(state.out.shape, generator=gen), None)
    dq_whole = torch.zeros_like(q0)
    dk_whole, dv_whole = attend.backward_block(c, saved, dq_whole, k0, v0, own)
    parts = attend.in_parts(c, saved, k0, v0, own)
    assert parts == [slice(0, 1), slice(1, 2)]
    dq = torch.zeros_like(q0)
    dk, dv = attend.backward_block(c, saved, dq, k0, v0, own, kv_heads=parts[0])
    arrived = torch.randn(dk.shape, generator=gen)
    dk.add_(arrived)
    dv.add_(arrived)
    attend.backward_block(c, saved, dq, k0, v0, own, kv_heads=parts[1], into=(dk, dv))
    assert_close(dq, dq_whole, atol=1e-6, rtol=1e-6)
    assert_close(dk - arrived, dk_whole, atol=1e-5, rtol=1e-5)
    assert_close(dv - arrived, dv_whole, atol=1e-5, rtol=1e-5)
