"""The compiled decode kernel against the float64 formula with FlashAttention's rule (error at most
2x a plain same-dtype implementation's), on every ISA build this CPU runs: GQA ratios, 1-16 query
rows x caches of 1 to 70k keys (odd sizes included), ragged per-batch cache lengths (0 included),
windows, softcap, ALiBi, float32 / bfloat16 / float16 caches read as stored, the key chunks
merged through the lse at any chunk size; NaN/Inf in the cache confined to the rows that see it.
The matrix is sampled (a fixed seed picks the cases); the largest caches are slow-marked."""

from __future__ import annotations

import math
import random
import threading
import time
import weakref

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks
from attnlab.ops.kernels import build
from interval_cases import OFF_CPU, formula, isa_params, masks_left_changed, need_compiler

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SLACK = {torch.float32: 1e-6, torch.bfloat16: 1e-3, torch.float16: 1e-4}


@pytest.fixture(autouse=True)
def _compiler():
    need_compiler()


def decode_intervals(kind: str, lens: list[int], L: int, S: int, window: int = 9):
    """int64 lo, hi (B, 1, L): each sequence's cache of lens[b] keys, bottom-right aligned on it
    (query i at position lens[b] - L + i), from the definitions."""
    i = torch.arange(L)
    lo, hi = [], []
    for n in lens:
        h = torch.full((L,), n) if kind == "full" else (n - L + 1 + i).clamp(0, n)
        if kind == "top_left":  # SDPA's is_causal: row i sees keys j <= i
            h = (i + 1).clamp(max=n)
        lo_b = (h - window).clamp(min=0) if kind == "window" else torch.zeros(L, dtype=torch.int64)
        empty = lo_b >= h
        lo.append(torch.where(empty, 0, lo_b))
        hi.append(torch.where(empty, 0, h))
    return torch.stack(lo)[:, None], torch.stack(hi)[:, None]


def err(x, ref):
    fin = torch.isfinite(ref)
    return (x.double() - ref)[fin].abs().max().item() if bool(fin.any()) else 0.0


def run_case(isa, B, H, Hkv, L, S, D, Dv, dtype, kind, softcap, alibi, ragged, chunk, seed):
    g = torch.Generator().manual_seed(seed)
    q64 = torch.randn(B, H, L, D, generator=g, dtype=torch.float64) * 2
    k64 = torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64)
    v64 = torch.randn(B, Hkv, S, Dv, generator=g, dtype=torch.float64)
    q, k, v = (x.to(dtype) for x in (q64, k64, v64))  # the inputs as the dtype holds them
    q64, k64, v64 = (x.double() for x in (q, k, v))
    lens = [S] * B
    if ragged:
        lens = [S - (b * 7919) % (S + 1) for b in range(B)]
        lens[-1] = 0 if B > 1 else lens[-1]
    lo, hi = decode_intervals(kind, lens, L, S)
    slopes = torch.linspace(0.05, 0.5, H)[None] if alibi else None
    scale, pos_off = 1 / math.sqrt(D), 5
    kw = dict(scale=scale, softcap=softcap, slopes=None if slopes is None else slopes[0],
              pos_off=pos_off)
    ref, ref_lse = formula(q64, k64, v64, lo, hi, **kw)
    plain, _ = formula(q, k, v, lo, hi, **kw)
    if not bool(torch.isfinite(plain[torch.isfinite(ref)]).all()):  # float16 overflowed (ALiBi
        plain, _ = formula(q.float(), k.float(), v.float(), lo, hi, **kw)  # at 70k): float32's
    ops = build.load(isa)
    out, lse, finite = ops.decode(q.float().contiguous(), k, v, lo.int(), hi.int(), slopes, scale,
                                  softcap or 0.0, pos_off, chunk, True)
    assert finite
    e, e_plain = err(out, ref), err(plain, ref)
    what = f"{isa} {dtype} B{B} H{H}/{Hkv} L{L} S{S} D{D}/{Dv} {kind} cap={softcap} alibi={alibi}"
    assert e <= 2 * e_plain + SLACK[dtype], f"{what}: error {e:.3e} > 2 x {e_plain:.3e}"
    empty = hi <= lo  # (B, 1, L): rows with no key are 0 with lse -inf, never NaN
    assert torch.equal(torch.isinf(lse), empty.expand_as(lse)), what
    assert bool((out[empty.expand(B, H, L)] == 0).all()), what
    assert err(lse, ref_lse) <= 2e-6 * max(1.0, ref_lse[torch.isfinite(ref_lse)].abs().max()
                                          .item() if bool(torch.isfinite(ref_lse).any())
                                          else 1.0), what


def sampled(n: int, seed: int, big: bool = False):
    """n cases of the matrix, drawn once from a fixed seed."""
    rnd = random.Random(seed)
    cases = []
    for t in range(n):
        Hkv = rnd.choice([1, 2] if big else [1, 2, 4])
        G = rnd.choice([1, 4] if big else [1, 2, 4, 8])
        L = rnd.choice([1, 3] if big else [1, 1, 2, 3, 7, 16])
        S = rnd.choice([70_001, 65_537] if big else [1, 2, 17, 97, 255, 513, 1031, 4099])
        D = rnd.choice([16, 32, 59, 64, 111, 128])
        Dv = D if rnd.random() < 0.7 else rnd.choice([16, 40, 64])
        cases.append(pytest.param(
            1 if big else rnd.choice([1, 2, 3]), Hkv * G, Hkv, L, S, D, Dv, DTYPES[t % 3],
            rnd.choice(["full", "causal", "window", "top_left"]),
            rnd.choice([None, None, 8.0]), rnd.random() < 0.3, rnd.random() < 0.5,
            rnd.choice([0, 0, 32, 64, 1024]), t, id=f"case{t}"))
    return cases


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize(("B", "H", "Hkv", "L", "S", "D", "Dv", "dtype", "kind", "softcap",
                          "alibi", "ragged", "chunk", "seed"), sampled(14, 37))
def test_decode_matrix(isa, B, H, Hkv, L, S, D, Dv, dtype, kind, softcap, alibi, ragged, chunk,
                       seed):
    run_case(isa, B, H, Hkv, L, S, D, Dv, dtype, kind, softcap, alibi, ragged, chunk, seed)


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("Dv", [32, 96, 160])
def test_bf16_values_read_even_and_odd(isa, Dv):
    """bfloat16 values whose head dim is whole pairs of vectors are read even/odd (one
    instruction per vector) into a permuted partial, put back in order at the merge: Dv of one,
    three and five 32-column blocks (a 4-vector tile and the 2-vector remainder), several chunks
    merged, rows of 4 and 3 heads, a window."""
    run_case(isa, 2, 8, 2, 3, 1031, 64, Dv, torch.bfloat16, "window", None, False, True, 256,
             Dv)
    run_case(isa, 1, 6, 2, 1, 300, 128, Dv, torch.bfloat16, "causal", 8.0, True, False, 0, Dv)


@pytest.mark.slow
@pytest.mark.parametrize(("B", "H", "Hkv", "L", "S", "D", "Dv", "dtype", "kind", "softcap",
                          "alibi", "ragged", "chunk", "seed"), sampled(3, 71, big=True))
def test_decode_long_caches(B, H, Hkv, L, S, D, Dv, dtype, kind, softcap, alibi, ragged, chunk,
                            seed):
    run_case(build.chosen_isa(), B, H, Hkv, L, S, D, Dv, dtype, kind, softcap, alibi, ragged,
             chunk, seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_builds_agree_and_threads_do_not_change_the_result(dtype):
    """Every ISA build and every thread count: the same answer within float rounding; a chunk
    of 32 keys (many partials, merged) equal to one chunk within rounding."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 8, 3, 64, generator=g).to(dtype).float()
    k, v = (torch.randn(2, 2, 3001, 64, generator=g).to(dtype) for _ in range(2))
    lo, hi = (x.int() for x in decode_intervals("causal", [3001, 1500], 3, 3001))
    outs = []
    for isa in build.runnable():
        for chunk in (0, 32):
            outs.append(build.load(isa).decode(q, k, v, lo, hi, None, 0.125, 0.0, 0, chunk,
                                               False)[0])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        ops = build.load(build.chosen_isa())
        outs.append(ops.decode(q, k, v, lo, hi, None, 0.125, 0.0, 0, 0, False)[0])
        # many items: whichever thread's partial of an item counts (a helper computes the items
        # left unfinished too), the same bits as one thread's
        one = ops.decode(q, k, v, lo, hi, None, 0.125, 0.0, 0, 64, False)[0]
        for _ in range(20):
            assert torch.equal(ops.decode(q, k, v, lo, hi, None, 0.125, 0.0, 0, 64, False)[0], one)
        torch.set_num_threads(1)
        assert torch.equal(ops.decode(q, k, v, lo, hi, None, 0.125, 0.0, 0, 64, False)[0], one)
    finally:
        torch.set_num_threads(before)
    for o in outs[1:]:
        assert (o - outs[0]).abs().max().item() < 2e-6


def test_a_late_helper_never_releases_the_callers_tensors():
    """A helper thread that starts after its call has returned (the OS, or PyTorch's OpenMP
    threads spinning after the op before, keeps it off the core) may still hold the call's cache;
    the cache's tensors are released on a calling thread, never on PyTorch's pool thread, where a
    release that takes the GIL while the interpreter exits aborted the process (~1 exit in 4 of a
    2-thread decoding script). Every tensor's release is seen from Python (weakref.finalize)."""
    main = threading.get_ident()
    where: list[int] = []
    w, x = torch.randn(1024, 1024), torch.randn(64, 1024)
    q = torch.randn(1, 32, 1, 64)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for _ in range(150):
            k, v = (torch.randn(1, 8, 4096, 64) for _ in range(2))
            for t in (k, v):
                weakref.finalize(t, lambda: where.append(threading.get_ident()))
            torch.nn.functional.linear(x, w)  # its OpenMP threads spin on the cores after it
            attnlab.attention(q, k, v, enable_gqa=True, backend="decode")
            del k, v, t
        time.sleep(0.05)  # the last call's helper done
        small = torch.randn(1, 8, 300, 64)
        attnlab.attention(q, small, small, enable_gqa=True, backend="decode")  # lets go of
        # what helpers left
    finally:
        torch.set_num_threads(before)
    assert len(where) == 300
    assert [t for t in where if t != main] == []


@OFF_CPU
def test_helpers_put_back_the_cpus_they_kept_off():
    """A helper keeps off its caller's CPU while it computes (OffCpu, csrc/queue.h) and then puts
    its CPU mask back: after many 2-thread calls no thread of the process is left restricted."""
    q = torch.randn(1, 32, 1, 64)
    k, v = (torch.randn(1, 8, 4096, 64) for _ in range(2))
    assert masks_left_changed(
        lambda: attnlab.attention(q, k, v, enable_gqa=True, backend="decode")) == {}


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_query_in_the_cache_dtype_and_no_intervals_are_the_same_call(dtype):
    """q in the cache's dtype (converted in the kernel, out in q's dtype) against q in float32
    (out float32, rounded as torch rounds it); lo, hi None against every row's [0, S), every
    build, chunks merged (32) or not: the same bits."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 8, 3, 64, generator=g).to(dtype)
    k, v = (torch.randn(2, 2, 777, 64, generator=g).to(dtype) for _ in range(2))
    lo, hi = torch.zeros(1, 1, 3, dtype=torch.int32), torch.full((1, 1, 3), 777, dtype=torch.int32)
    for isa in build.runnable():
        ops = build.load(isa)
        for chunk in (0, 32):
            want, want_lse, _ = ops.decode(q.float(), k, v, lo, hi, None, 0.125, 0.0, 0, chunk,
                                           True)
            for a, b in ((lo, hi), (None, None)):
                out, lse, finite = ops.decode(q, k, v, a, b, None, 0.125, 0.0, 0, chunk, True)
                assert finite and out.dtype == dtype and torch.equal(lse, want_lse), isa
                assert torch.equal(out, want.to(dtype)), isa
    with pytest.raises(RuntimeError, match="both or neither"):
        ops.decode(q, k, v, lo, None, None, 0.125, 0.0, 0, 0, True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_querys_out_is_rounded_as_torch_rounds_it(dtype):
    """One key: out is the value row exactly (weight 1), so a 16-bit q's out is the kernel's own
    rounding of those floats: ties either way, subnormal and overflowing halves, infinities and
    NaNs (quiet and signalling, either sign) give Tensor.to's bits on every build."""
    bits = [0x3F808000, 0x3F818000, 0x3F80FFFF, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x7F7FFFFF,
            0x38800000, 0x387FFFFF, 0x33000000, 0x33000001, 0x32FFFFFF, 0x337FFFFF, 0x33C00000,
            0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7FA00001, 0xFF812345, 0x00000001,
            0x3DCCCCCD, 0xC2F6E979, 0x3FFFFFFF]
    g = torch.Generator().manual_seed(9)
    vals = torch.cat([torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32),
                      torch.randn(1000, generator=g) * 10.0 ** torch.randint(-9, 6, (1000,),
                                                                              generator=g)])
    v = vals.reshape(1, 1, 1, -1)  # (B, Hkv, S = 1, Dv)
    q, k = torch.ones(1, 2, 1, 16).to(dtype), torch.zeros(1, 1, 1, 16)
    want = vals.to(dtype).view(torch.int16).reshape(1, 1, 1, -1).expand(1, 2, 1, -1)
    for isa in build.runnable():
        out, _, _ = build.load(isa).decode(q, k, v, None, None, None, 0.125, 0.0, 0, 0, False)
        assert out.dtype == dtype and torch.equal(out.view(torch.int16), want), isa


def tile_against_vector(monkeypatch, q, k, v, lo, hi, chunks=(0,)):
    """bfloat16 q (B, G·Hkv, L, D) and k, v (B, Hkv, S, D) through the decode op with the AMX tile
    unit's q·k (where the CPU has it) and with the vector path (ATTNLAB_DECODE_AMX=0), at each
    chunk size: every answer within FlashAttention's rule of float64 (2x float32's error), the
    tile unit's equal to the vector path's within rounding."""
    G, D, S = q.shape[1] // k.shape[1], q.shape[-1], k.shape[2]
    ops = build.load(build.chosen_isa())
    outs = {}
    for amx in ("1", "0"):
        monkeypatch.setenv("ATTNLAB_DECODE_AMX", amx)
        for chunk in chunks:
            outs[amx, chunk] = ops.decode(q, k, v, lo.int(), hi.int(), None, D ** -0.5, 0.0, 0,
                                          chunk, True)
    assert all(finite for _, _, finite in outs.values())
    kd, vd = (x.double().repeat_interleave(G, 1) for x in (k, v))
    j = torch.arange(S)
    keep = (j >= lo[..., None]) & (j < hi[..., None])  # (B, 1, L, S)
    sc = (q.double() @ kd.transpose(-1, -2) * D ** -0.5).masked_fill(~keep, float("-inf"))
    ref = torch.softmax(sc, -1) @ vd
    low = torch.softmax(sc.float(), -1) @ vd.float()  # the same formula in float32
    bound = 2 * (low.double() - ref).abs().max().item() + 1e-6
    for out, _, _ in outs.values():
        assert (out.double() - ref).abs().max().item() <= bound
    for chunk in chunks:
        assert (outs["1", chunk][0] - outs["0", chunk][0]).abs().max().item() < 1e-5


@pytest.mark.parametrize("G, D", [(4, 128), (4, 64), (16, 32), (2, 256), (1, 64)])
def test_bf16_scores_from_the_tile_unit_match_the_vector_path(monkeypatch, G, D):
    """bfloat16 keys and queries: the AMX tile unit's q·k (where the CPU has it, whole 64-key
    blocks) and the vector path (ATTNLAB_DECODE_AMX=0) agree and both keep FlashAttention's
    rule against float64, with ragged rows, a window and several query rows."""
    g = torch.Generator().manual_seed(21)
    B, Hkv, L, S = 2, 2, 3, 1000
    q = torch.randn(B, G * Hkv, L, D, generator=g).to(torch.bfloat16).float()
    k, v = (torch.randn(B, Hkv, S, D, generator=g).to(torch.bfloat16) for _ in range(2))
    lo, hi = decode_intervals("window", [1000, 611], L, S, window=700)
    tile_against_vector(monkeypatch, q, k, v, lo, hi)


@pytest.mark.parametrize("G, D", [(4, 64), (4, 128), (1, 128)])
def test_tile_products_issued_through_the_block_before(monkeypatch, G, D):
    """The tile unit's products of block j + 1 are issued one at a time during block j's P·V
    (AmxSteps): query row 0 sees keys [0, 10), row 1 keys [189, S), so the block [128, 192)
    has 3 keys some row sees, fewer than the products (8 at D = 64, 16 at 128), and the rest are
    issued after its loop; chunks of 4 blocks merged and the kernel's own chunks, ragged ends."""
    g = torch.Generator().manual_seed(22)
    B, Hkv, L, S = 2, 2, 2, 1000
    q = torch.randn(B, G * Hkv, L, D, generator=g).to(torch.bfloat16).float()
    k, v = (torch.randn(B, Hkv, S, D, generator=g).to(torch.bfloat16) for _ in range(2))
    lo = torch.tensor([[0, 189], [0, 189]]).view(B, 1, L)
    hi = torch.tensor([[10, S], [10, S - 100]]).view(B, 1, L)
    tile_against_vector(monkeypatch, q, k, v, lo, hi, chunks=(256, 0))


def test_the_cache_is_read_in_place_from_a_slice():
    """A view of a preallocated cache (rows of a longer buffer, heads strided) is read as it is."""
    g = torch.Generator().manual_seed(5)
    buf = torch.randn(2, 4, 500, 64, generator=g, dtype=torch.bfloat16)
    k, v = buf[:, :2, :300], buf[:, 2:, :300]  # (2, 2, 300, 64) strided views
    q = torch.randn(2, 8, 1, 64, generator=g, dtype=torch.bfloat16)
    got = attnlab.attention(q, k, v, enable_gqa=True, backend="decode")
    want = attnlab.attention(q, k.contiguous(), v.contiguous(), enable_gqa=True, backend="math")
    assert (got.float() - want.float()).abs().max().item() < 2e-2


@pytest.mark.parametrize("where", ["seen", "past_length", "outside_window", "query"])
def test_nonfinite_in_the_cache_stays_in_the_rows_that_see_it(where):
    """NaN/Inf in a cache row is NaN in exactly the rows that may attend it, as on "math"."""
    g = torch.Generator().manual_seed(9)
    B, H, Hkv, L, S, D = 2, 4, 2, 3, 700, 32
    q = torch.randn(B, H, L, D, generator=g)
    k, v = torch.randn(B, Hkv, S, D, generator=g), torch.randn(B, Hkv, S, D, generator=g)
    lens = torch.tensor([700, 400])
    m = masks.causal("bottom_right") & masks.padding(key_lengths=lens)
    if where == "outside_window":
        m = m & masks.sliding_window(50, "bottom_right")
    if where == "seen":
        k[0, 1, 650, 3] = float("nan")
    elif where == "past_length":
        v[1, 0, 550, 0] = float("inf")  # sequence 1 has 400 keys: no row sees it
    elif where == "outside_window":
        k[0, 0, 100, 0] = float("nan")
    else:
        q[1, 2, 1, 0] = float("inf")
    kw = dict(mask=m, enable_gqa=True, return_lse=True)
    out, lse = attnlab.attention(q, k, v, backend="decode", **kw)
    ref, ref_lse = attnlab.attention(q, k, v, backend="math", **kw)
    live = ~torch.isnan(ref_lse)
    assert torch.equal(torch.isinf(lse[live]), torch.isinf(ref_lse[live]))
    nan_rows = torch.isnan(ref).any(-1)
    assert torch.equal(torch.isnan(out).any(-1), nan_rows)
    assert torch.equal(torch.isnan(lse), nan_rows)
    assert (out[~nan_rows] - ref[~nan_rows]).abs().max().item() < 1e-5
    assert int(nan_rows.sum()) == {"seen": 2 * L, "past_length": 0, "outside_window": 0,
                                   "query": 1}[where]


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_the_kernel_reports_every_nonfinite_row_some_row_reads(isa, dtype):
    """The kernel's own check (keys through their scores, values through the sums): a NaN, +Inf
    or -Inf key or value that some query row attends is reported, whichever row of a block it
    is and whether or not the other rows of the item attend it; one that no row attends is not."""
    g = torch.Generator().manual_seed(11)
    B, H, Hkv, L, S, D = 2, 4, 2, 2, 300, 64
    q = torch.randn(B, H, L, D, generator=g).to(dtype).float()
    ks, vs = (torch.randn(B, Hkv, S, D, generator=g).to(dtype) for _ in range(2))
    lo, hi = (x.int() for x in decode_intervals("window", [300, 200], L, S, window=120))
    ops = build.load(isa)

    def finite(k, v):
        return ops.decode(q, k, v, lo, hi, None, 0.125, 0.0, 0, 64, True)[2]

    assert finite(ks, vs)
    # (batch, key): batch 1's row 0 sees keys [79, 199), row 1 [80, 200): key 79 only row 0,
    # 199 only row 1
    for b, j in ((0, 299), (0, 180), (1, 79), (1, 199), (1, 150)):
        for bad in (float("nan"), float("inf"), -float("inf")):
            for which in ("k", "v"):
                k, v = ks.clone(), vs.clone()
                (k if which == "k" else v)[b, 1, j, 7] = bad
                assert not finite(k, v), (isa, dtype, b, j, bad, which)
    for b, j in ((1, 200), (1, 250), (0, 10), (1, 78)):  # past the length, before the window
        for which in ("k", "v"):
            k, v = ks.clone(), vs.clone()
            (k if which == "k" else v)[b, 0, j, 0] = float("nan")
            assert finite(k, v), (isa, dtype, b, j, which)


def test_no_mask_nan_key_poisons_the_heads_that_read_it():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 1, 16, generator=g)
    k, v = torch.randn(1, 2, 300, 16, generator=g), torch.randn(1, 2, 300, 16, generator=g)
    k[0, 0, 5, 3] = float("nan")
    out = attnlab.attention(q, k, v, enable_gqa=True, backend="decode")
    assert torch.isnan(out[0, :2]).all() and not torch.isnan(out[0, 2:]).any()


def test_auto_takes_decode_shaped_calls_and_says_so():
    q = torch.randn(1, 8, 1, 64)
    k, v = torch.randn(1, 2, 4096, 64), torch.randn(1, 2, 4096, 64)
    for kw in (dict(), dict(is_causal=True), dict(mask=masks.causal("bottom_right")),
               dict(mask=masks.sliding_window(128, "bottom_right")), dict(softcap=30.0),
               dict(return_lse=True)):
        c = attnlab.select_backend(q, k, v, enable_gqa=True, **kw)
        assert c.backend == "decode", (kw, c)
        assert "decode kernel" in c.reason and "4 query heads" in c.reason
    # no grouped heads and nothing SDPA cannot say: SDPA's kernel below 4096 keys, the decode
    # kernel's from there
    for D, dtype in ((64, torch.float32), (128, torch.bfloat16)):
        qm = torch.zeros(1, 8, 1, D, dtype=dtype)
        big = torch.zeros(1, 1, 1, D, dtype=dtype).expand(1, 8, 4096, D)  # nothing is computed
        pick = attnlab.select_backend(qm, big, big)
        assert pick.backend == "decode" and "from 4096 keys" in pick.reason, (D, pick)
        assert attnlab.select_backend(qm, big[:, :, 1:], big[:, :, 1:]).backend == "sdpa", D
    ragged = masks.padding(key_lengths=[4096])
    assert attnlab.select_backend(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1),
                                  mask=ragged).backend == "decode"
    long_q = torch.randn(1, 8, 17, 64)
    assert attnlab.select_backend(long_q, k, v, enable_gqa=True).backend != "decode"
    short_k, short_v = k[:, :, :255], v[:, :, :255]
    assert attnlab.select_backend(q, short_k, short_v, enable_gqa=True).backend != "decode"
    got = attnlab.attention(long_q, k, v, enable_gqa=True, backend="decode")  # forced: exact
    want = attnlab.attention(long_q, k, v, enable_gqa=True, backend="math")
    assert (got - want).abs().max().item() < 1e-5
    with pytest.raises(AttnlabError, match="attn_mask: backend \"decode\""):
        attnlab.attention(q, k, v, attn_mask=torch.ones(1, 4096, dtype=torch.bool),
                          enable_gqa=True, backend="decode")


def test_gradients_through_decode_are_the_interval_kernels():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 2, 32, generator=g, requires_grad=True)
    k = torch.randn(2, 2, 300, 32, generator=g, requires_grad=True)
    v = torch.randn(2, 2, 300, 32, generator=g, requires_grad=True)
    m = masks.causal("bottom_right")
    grads = []
    for backend in ("decode", "math"):
        out, lse = attnlab.attention(q, k, v, mask=m, enable_gqa=True, backend=backend,
                                     return_lse=True)
        grads.append(torch.autograd.grad((out * out).sum() + lse.sum(), (q, k, v)))
    for a, b in zip(*grads):
        assert (a - b).abs().max().item() < 1e-4
