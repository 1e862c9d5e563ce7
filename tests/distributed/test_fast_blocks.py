"""Blocks on the single-process path: a block of two runs of consecutive positions hands the op
the global mask seen from the block (`BlockOf`), so no dense host mask is built for it; the plan
of a call signature is made once per process."""

import pytest
import torch

import attnlab
import attnlab.distributed as cp
from attnlab import masks
from attnlab.distributed import api
from attnlab.distributed.blockmask import BlockOf

from helpers import assert_close


def _qkv(L, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, L, 16, generator=g, dtype=torch.float64).requires_grad_()
            for _ in range(3)]


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("kind", ["window", "document", "not_window"])
def test_blocks_build_no_dense_mask(kind, layout, monkeypatch):
    L = 300
    m = {"window": masks.sliding_window(37), "document": masks.document(torch.arange(L) // 70),
         "not_window": ~masks.sliding_window(250)}[kind]

    def refuse(*a, **k):
        raise AssertionError("a dense block of the global mask was built")

    q, k, v = _qkv(L)
    ref = attnlab.attention(q, k, v, mask=m, backend="math")
    ref_g = torch.autograd.grad(ref.sum(), (q, k, v))
    # on the class: an instance attribute holding a function would make the cross-rank check
    # compare the mask by what it does (a function inside), which evaluates sampled rows
    monkeypatch.setattr(type(m), "block", refuse)
    out = cp.context_parallel_attention(q, k, v, mask=m, layout=layout, strategy="ring")
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert_close(out, ref, atol=1e-12, rtol=1e-12)
    for a, b in zip(grads, ref_g):
        assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_block_of_is_the_global_mask_shifted():
    L, S = 97, 113
    m = masks.sliding_window(9) | masks.prefix_lm(5)
    b = BlockOf(~masks.sliding_window(9), 30, 20, L, S)
    dense = (~masks.sliding_window(9)).to_dense(L, S)
    assert torch.equal(b.to_dense(40, 50), dense[..., 30:70, 20:70])
    t = b.tiles(40, 50, 8, 8)
    full = b.to_dense(40, 50)[0, 0]
    for i in range(t.shape[2]):
        for j in range(t.shape[3]):
            tile = full[8 * i:8 * i + 8, 8 * j:8 * j + 8]
            want = 2 if bool(tile.all()) else 0 if not bool(tile.any()) else 1
            assert int(t[0, 0, i, j]) == want
    assert repr(BlockOf(m, 1, 2, L, S)).startswith("BlockOf(")


def test_a_call_signature_plans_once(monkeypatch):
    made = []
    real = api.Geometry

    def counting(*a, **k):
        made.append(a)
        return real(*a, **k)

    monkeypatch.setattr(api, "Geometry", counting)
    api._PLANS.clear()
    q, k, v = _qkv(64)
    for _ in range(3):
        cp.context_parallel_attention(q, k, v, is_causal=True)
    assert len(made) == 1
    cp.context_parallel_attention(q, k, v, mask=masks.document(torch.arange(64) // 20))
    cp.context_parallel_attention(q, k, v, mask=masks.document(torch.arange(64) // 21))
    cp.context_parallel_attention(q, k, v, mask=masks.document(torch.arange(64) // 20))
    assert len(made) == 3  # the ids differ: two plans; the third call reuses the first


def test_a_mask_is_hashed_once_until_written(monkeypatch):
    """The signature's mask fingerprint digests each tensor once while it is unchanged (a call
    after the first does not re-hash the segment ids); an in-place write changes it."""
    from attnlab.distributed import validate

    hashed = [0]  # bytes fed to sha1
    real = validate.hashlib.sha1

    class Counting:
        def __init__(self, data=b""):
            self.h = real(data)
            hashed[0] += len(data)

        def update(self, data):
            hashed[0] += len(data)
            self.h.update(data)

        def digest(self):
            return self.h.digest()

        def hexdigest(self):
            return self.h.hexdigest()

    m = masks.document(torch.arange(4096) // 1000)  # two (1, 4096) int64 id tensors: 64 KiB
    first = validate.fingerprint(m)
    monkeypatch.setattr(validate.hashlib, "sha1", Counting)
    assert validate.fingerprint(m) == first
    assert hashed[0] < 4096  # names, reprs and the two cached digests: not the ids again
    m.q_seg[..., 0] = 7  # in place: the version counter moves
    assert validate.fingerprint(m) != first
    assert hashed[0] > 4096 * 8


@pytest.mark.parametrize("q0, k0", [(150, 100), (0, 0), (250, 280)])
def test_block_intervals_are_the_global_rows_shifted(q0, k0):
    """An interval-shaped block reaches the interval kernel with the right per-row intervals."""
    m = masks.sliding_window(37) & masks.document(torch.arange(300) // 70)
    b = BlockOf(m, q0, k0, 300, 300)
    Lb, Sb = min(100, 300 - q0), min(120, 300 - k0)
    lo, hi = b.intervals(Lb, Sb)
    cols = torch.arange(Sb)
    want = b.to_dense(Lb, Sb)[0, 0]
    got = (cols[None, :] >= lo[0, 0, :, None]) & (cols[None, :] < hi[0, 0, :, None])
    assert torch.equal(got, want)
    assert BlockOf(~masks.sliding_window(9), q0, k0, 300, 300).intervals(Lb, Sb) is None


@pytest.mark.parametrize("mask, band, keys", [
    (masks.sliding_window(64), (0, 63), (449, 512)),  # rows 512..574 reach back to keys 449..
    (masks.document(torch.arange(1024) // 300), (0, 88), (300, 512)),  # document 1: 300..599
    (masks.sliding_window(64) & masks.document(torch.arange(1024) // 540), (0, 28),
     (449, 512)),
])
def test_a_partial_block_runs_only_the_rows_and_keys_that_reach_each_other(mask, band, keys):
    """P = 1, zigzag: two chunks of 512; the block of chunk 1's rows against chunk 0's keys is
    the band of rows whose keys reach back into chunk 0, against the band of keys they reach,
    with the mask seen from the block's first row and key."""
    from attnlab.distributed.attend import Call
    from attnlab.distributed.geometry import Geometry

    geom = Geometry(1024, 1024, 1, "zigzag", mask)
    c = Call(geom, None, 0, 1, 0.125, None, torch.float32)
    q = torch.zeros(1, 2, 1024, 8)
    qp, kp = c.q_pieces[1], c.q_pieces[0]
    got = [(r, k, a) for qi, r, k, a in c.pairs([kp], q) if qi == 1]
    assert len(got) == 1
    rows, kq, blk = got[0]
    assert (rows.start - qp.start, rows.stop - qp.start) == band
    assert (kq.start - kp.start, kq.start - kp.start + kq.length) == keys
    assert torch.equal(kq.positions, torch.arange(*keys))
    n, m = rows.stop - rows.start, kq.length
    dense = mask.to_dense(1024, 1024)
    want = dense[..., 512 + band[0]:512 + band[1], keys[0]:keys[1]]
    assert torch.equal(blk.to_dense(n, m), want.expand_as(blk.to_dense(n, m)))
    assert not bool(dense[..., 512 + band[0]:512 + band[1], :keys[0]].any())
    assert bool(mask.to_dense(1024, 1024)[..., 512 + band[1]:, :512].any()) is False
