"""from_function: FlexAttention's mask_mod convention as an attnlab mask. Its dense matrix, exact
tile classes (as create_block_mask), the cache, composition with the built-in kinds, and attention
with it exact against its dense materialisation on every backend, forward and backward."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks
from attnlab.masks import EMPTY, FULL

from helpers import tiles_from_dense

DOCS = torch.tensor([0] * 7 + [1] * 12 + [2] * 3 + [3] * 9)  # 31 positions


def sliding(b, h, q, k):
    return (q >= k) & (q - k < 5)


def doc_causal(b, h, q, k):
    return (DOCS[q] == DOCS[k]) & (q >= k)


LENS = torch.tensor([9, 23])


def per_batch_prefix(b, h, q, k):
    return k < LENS[b]


def per_head_stride(b, h, q, k):
    return (q - k) % (h + 1) == 0


FUNCS = {
    "sliding": (sliding, {}, lambda: masks.sliding_window(5)),
    "doc_causal": (doc_causal, {}, lambda: masks.causal() & masks.document(DOCS)),
    "per_batch": (per_batch_prefix, {"batch_size": 2}, lambda: masks.padding(key_lengths=LENS)),
    "per_head": (per_head_stride, {"heads": 3}, None),
}
L = S = 31


def brute(fn, B, H, n, m):
    return torch.tensor([[[[bool(fn(torch.tensor(b), torch.tensor(h), torch.tensor(i),
                                     torch.tensor(j))) for j in range(m)] for i in range(n)]
                          for h in range(H)] for b in range(B)])


@pytest.mark.parametrize("name", list(FUNCS))
def test_dense_is_the_function_pair_by_pair(name):
    fn, kw, builtin = FUNCS[name]
    m = masks.from_function(fn, **kw)
    want = brute(fn, m.batch_size, m.heads, L, S)
    assert torch.equal(m.to_dense(L, S), want)
    if builtin is not None:
        assert torch.equal(m.to_dense(L, S), builtin().to_dense(L, S).expand_as(want))


@pytest.mark.parametrize("name", list(FUNCS))
@pytest.mark.parametrize("bq,bk", [(1, 1), (4, 4), (3, 7), (16, 8), (64, 64)])
def test_tiles_are_exact(name, bq, bk):
    fn, kw, _ = FUNCS[name]
    m = masks.from_function(fn, **kw)
    assert torch.equal(m.tiles(L, S, bq, bk), tiles_from_dense(m.to_dense(L, S), bq, bk))


@pytest.mark.parametrize("name", list(FUNCS))
@pytest.mark.parametrize("bq,bk", [(1, 1), (3, 7), (16, 8)])
def test_device_classification_is_exact(name, bq, bk):
    """The form used inside `&`/`|` on a device (block ids by searchsorted, no block sizes)."""
    fn, kw, _ = FUNCS[name]
    m = masks.from_function(fn, **kw)
    got = m._classes(L, S, torch.arange(0, L, bq), torch.arange(0, S, bk))
    assert torch.equal(got, tiles_from_dense(m.to_dense(L, S), bq, bk))


@pytest.mark.parametrize("interval", [True, False])
def test_tiles_are_evaluated_once_per_shape(interval):
    """One evaluation per (L, S): an interval-shaped function classifies other tile shapes from
    its intervals; any other is evaluated again for another tile shape only."""
    calls = []

    def counted(b, h, q, k):
        calls.append(1)
        return q >= k if interval else (q - k) % 3 != 1

    m = masks.from_function(counted)
    a = m.tiles(300, 300, 16, 16)
    n = len(calls)
    assert torch.equal(m.tiles(300, 300, 16, 16), a) and len(calls) == n
    (m & masks.padding(key_lengths=[200])).tiles(300, 300, 16, 16)
    assert len(calls) == n  # a part of `&` reuses the cache too
    assert (m.intervals(300, 300) is not None) == interval and len(calls) == n
    b = m.tiles(300, 300, 32, 16)
    assert (len(calls) > n) != interval  # another shape: evaluated again unless intervals
    assert torch.equal(b, tiles_from_dense(m.to_dense(300, 300), 32, 16))


def test_tiles_bounded_memory(monkeypatch):
    """Classification evaluates a band of rows at a time, never the whole L×S at once."""
    from attnlab.masks import function
    monkeypatch.setattr(function, "BLOCK_ENTRIES", 64 * 100)
    seen = []

    def spy(b, h, q, k):
        seen.append(q.numel() * k.numel())
        return q >= k

    t = masks.from_function(spy).tiles(100, 100, 8, 8)
    assert max(seen) <= 64 * 100 and len(seen) > 1
    assert torch.equal(t, masks.causal().tiles(100, 100, 8, 8))


@pytest.mark.parametrize("combo", ["and", "or", "not", "and_builtin_left"])
def test_composes_with_builtins(combo):
    f = masks.from_function(sliding)
    pad = masks.padding(key_lengths=[20, 31])
    m, want = {
        "and": (f & pad, f.to_dense(L, S) & pad.to_dense(L, S)),
        "or": (f | masks.causal("bottom_right"), f.to_dense(L, S)
               | masks.causal("bottom_right").to_dense(L, S)),
        "not": (~f, ~f.to_dense(L, S)),
        "and_builtin_left": (masks.causal() & f, masks.causal().to_dense(L, S) & f.to_dense(L, S)),
    }[combo]
    assert torch.equal(m.to_dense(L, S), want)
    t, exact = m.tiles(L, S, 4, 4), tiles_from_dense(want, 4, 4)
    assert ((t == EMPTY) <= (exact == EMPTY)).all() and ((t == FULL) <= (exact == FULL)).all()


def test_intervals_found_in_the_one_evaluation():
    """An interval-shaped function gives its rows' intervals; a gap in any row (of any head)
    makes it None; the evaluation also classified the first tiles."""
    got = masks.from_function(sliding).intervals(L, S)
    assert got is not None
    lo, hi = got
    j = torch.arange(S)
    assert torch.equal(((j >= lo[..., None].long()) & (j < hi[..., None].long()))[0, 0],
                       masks.sliding_window(5).to_dense(L, S)[0, 0])
    assert masks.from_function(lambda b, h, q, k: (q - k) % 7 != 3).intervals(L, S) is None
    gap_in_head_2 = masks.from_function(lambda b, h, q, k: (k != 3) | (h != 2), heads=3)
    assert gap_in_head_2.intervals(L, S) is None
    assert masks.from_function(lambda b, h, q, k: k > 40 + q).intervals(L, S) is not None  # empty


@pytest.mark.parametrize("fn,match", [
    (lambda b, h, q, k: (q - k).float(), "bool"),
    (lambda b, h, q, k: True, "bool"),
    (lambda b, h, q, k: torch.ones(3, 3, 3, 3, 3, dtype=torch.bool), "broadcast"),
])
def test_bad_functions(fn, match):
    with pytest.raises(AttnlabError, match=match):
        masks.from_function(fn).to_dense(4, 4)


def test_bad_arguments():
    with pytest.raises(AttnlabError, match="callable"):
        masks.from_function(3)
    with pytest.raises(AttnlabError, match="heads"):
        masks.from_function(sliding, heads=0)


# -- attention with a mask function: exact vs its dense materialisation ---------------------------

BACKENDS = ["math", "tiled", "sdpa", "reference", "auto"]


@pytest.mark.parametrize("name", list(FUNCS))
@pytest.mark.parametrize("Lq,Sk", [(31, 31), (13, 31), (31, 7)])
def test_forward_exact_on_every_backend(name, Lq, Sk):
    fn, kw, _ = FUNCS[name]
    m = masks.from_function(fn, **kw)
    if name == "doc_causal" and Lq != Sk:
        pytest.skip("document ids cover one length")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64) for n in (Lq, Sk, Sk))
    dense = m.to_dense(Lq, Sk)
    want, want_lse = attnlab.attention(q, k, v, attn_mask=dense, backend="math",
                                       return_lse=True)
    for backend in BACKENDS:
        out, lse = attnlab.attention(q, k, v, mask=m, backend=backend, return_lse=True)
        assert (out - want).abs().max() < 1e-12, backend
        assert torch.equal(lse.isinf(), want_lse.isinf())
        fin = want_lse.isfinite()
        assert (lse[fin] - want_lse[fin]).abs().max() < 1e-12, backend
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", ["sliding", "per_batch", "per_head"])
def test_backward_exact(name):
    fn, kw, _ = FUNCS[name]
    m = masks.from_function(fn, **kw)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64, requires_grad=True)
               for n in (29, 31, 31))
    dense = m.to_dense(29, 31)
    out = attnlab.attention(q, k, v, attn_mask=dense, backend="math")
    want = torch.autograd.grad(out.square().sum(), (q, k, v))
    for backend in ("tiled", "math", "sdpa"):
        out = attnlab.attention(q, k, v, mask=m, backend=backend)
        got = torch.autograd.grad(out.square().sum(), (q, k, v))
        for a, b in zip(got, want):
            assert (a - b).abs().max() < 1e-12, backend


def test_long_tiled_skips_the_same_tiles_as_the_builtin():
    from attnlab.ops import tiled
    from attnlab.ops.validate import make_problem
    q = torch.randn(1, 1, 2048, 8)
    plans = [tiled.make_plan(make_problem(q, q, q, None, 0.0, False, None, False, mask=m))
             for m in (masks.from_function(sliding), masks.sliding_window(5))]
    assert plans[0] == plans[1] and plans[0].density < 0.1


def test_weights_on_demand():
    m = masks.from_function(doc_causal)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 31, 8, generator=g, dtype=torch.float64) for _ in range(3))
    _, w = attnlab.ops.attention_with_weights(q, k, v, mask=m, rows=[0, 8, 30])
    want = torch.softmax((q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(
        ~m.to_dense(31, 31), float("-inf")), -1)[:, :, [0, 8, 30]]
    assert (w - want).abs().max() < 1e-12


def test_context_parallel_transfer_sets_match_the_builtin():
    """Context parallelism plans its transfers from the generic tile classes: a mask function
    gives the same key needs as the built-in kind it equals."""
    from attnlab.distributed.geometry import Geometry
    for layout in ("contiguous", "zigzag"):
        a = Geometry(L=512, S=512, world=4, layout=layout, mask=masks.from_function(sliding))
        b = Geometry(L=512, S=512, world=4, layout=layout, mask=masks.sliding_window(5))
        assert torch.equal(a.need_blocks, b.need_blocks)
        assert a.work_pairs() == b.work_pairs()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # fused and plain chunk paths
def test_tiled_keeps_chunk_masks_across_calls(dtype):
    """A mask function is not shift invariant, so the tiled kernel keeps each chunk's mask in
    the mask's store: the second call of a shape evaluates fn no more, and stays exact (also
    with NaN keys, which must not reuse the clean-keys shortcut)."""
    calls = []

    def sliding9(b, h, q, k):
        calls.append(1)
        return (q >= k) & (q - k < 9)

    m = masks.from_function(sliding9)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 600, 16, generator=g, dtype=dtype) for _ in range(3))
    first = attnlab.attention(q, k, v, mask=m, backend="tiled")
    n = len(calls)
    again = attnlab.attention(q, k, v, mask=m, backend="tiled")
    assert len(calls) == n and torch.equal(first, again)
    k[0, 1, 300, 0] = float("nan")
    want = attnlab.attention(q, k, v, mask=masks.sliding_window(9), backend="math")
    got = attnlab.attention(q, k, v, mask=m, backend="tiled")
    assert torch.equal(got.isnan(), want.isnan())
    assert (got[~want.isnan()] - want[~want.isnan()]).abs().max() < 1e-5


# -- b and h from the call (issue 35 item 1) ------------------------------------------------------


def checkerboard(b, h, q, k):
    return (q // 7 + k // 5 + b + h) % 2 == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_function_reading_b_and_h_is_evaluated_at_the_calls(backend):
    """Without batch_size/heads, a per-batch, per-head checkerboard at B = 2, H = 4 is evaluated
    at every b and h of the call, never at b = h = 0 only."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 300, 8, generator=g, dtype=torch.float64) for _ in range(3))
    b, h = torch.arange(2)[:, None, None, None], torch.arange(4)[None, :, None, None]
    i, j = torch.arange(300)[:, None], torch.arange(300)[None, :]
    dense = checkerboard(b, h, i, j)  # (2, 4, 300, 300)
    want = attnlab.attention(q, k, v, attn_mask=dense, backend="math")
    out = attnlab.attention(q, k, v, mask=masks.from_function(checkerboard), backend=backend)
    assert (out - want).abs().max() < 1e-10


def test_b_and_h_read_or_not():
    m = masks.from_function(checkerboard)
    assert m.reads() == (True, True)
    assert masks.from_function(lambda b, h, q, k: (q >= k) | (h == 1)).reads() == (False, True)
    assert masks.from_function(sliding).reads() == (False, False)
    assert masks.from_function(sliding).for_call(3, 5).batch_size == 1
    bound = m.for_call(2, 4)
    assert (bound.batch_size, bound.heads) == (2, 4) and m.for_call(2, 4) is bound
    with pytest.raises(AttnlabError, match="reads b and h"):
        m.to_dense(8, 8)  # outside a call, how many b and h is not known: never b = h = 0
    with pytest.raises(AttnlabError, match="heads=4"):
        masks.from_function(checkerboard, batch_size=2, heads=1).for_call(2, 4)
    both = masks.causal() & ~m  # composites take the call's sizes too
    assert both.for_call(2, 4).heads == 4 and both.for_call(2, 4) is both.for_call(2, 4)


def test_an_interval_shaped_function_runs_on_the_interval_kernel():
    """Issue 35: a function equal to a sliding window reaches the compiled interval kernel, with
    the built-in's numbers, forward and backward; one with a gap in a row does not."""
    from attnlab.ops import kernels
    from interval_cases import need_compiler

    need_compiler()
    if not kernels.available():
        pytest.skip("the interval kernel is not available")
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, 200, 16, generator=g, requires_grad=True) for _ in range(3))
    fn, builtin = masks.from_function(sliding), masks.sliding_window(5)
    assert attnlab.select_backend(q, k, v, mask=fn).backend == "interval"
    out = attnlab.attention(q, k, v, mask=fn)
    want = attnlab.attention(q, k, v, mask=builtin)
    assert torch.equal(out, want)
    g1 = torch.autograd.grad(out.sum(), (q, k, v))
    g2 = torch.autograd.grad(want.sum(), (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))
    gap = masks.from_function(lambda b, h, i, j: (i >= j) & (i - j != 2))
    assert attnlab.select_backend(q, k, v, mask=gap).backend != "interval"


def test_row_interval_against_brute_force():
    """Each row's first and last key and whether it is one interval, on rows of every shape:
    empty, full, one key, one run anywhere, runs with one-key gaps, random."""
    from attnlab.masks.function import _row_interval

    g = torch.Generator().manual_seed(5)
    S = 13
    rows = [torch.zeros(S, dtype=torch.bool), torch.ones(S, dtype=torch.bool)]
    for a in range(S):
        for b in range(a + 1, S + 1):
            r = torch.zeros(S, dtype=torch.bool)
            r[a:b] = True
            rows.append(r)
            if b - a >= 3:
                r2 = r.clone()
                r2[a + 1] = False
                rows.append(r2)
    rows += list(torch.rand(200, S, generator=g) > 0.5)
    m = torch.stack(rows)[None, None]  # (1, 1, n, S)
    lo, hi, ok = _row_interval(m, torch.arange(S))
    for i, r in enumerate(rows):
        keys = r.nonzero()[:, 0].tolist()
        want_lo, want_hi = (keys[0], keys[-1] + 1) if keys else (0, 0)
        assert (int(lo[0, 0, i]), int(hi[0, 0, i])) == (want_lo, want_hi), r
        assert bool(ok[0, 0, i]) == (len(keys) == want_hi - want_lo), r
