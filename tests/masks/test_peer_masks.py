"""The structured features of flash-attention and xformers, as attnlab masks and modifiers, against
each peer's own reference definition re-implemented here in float64 (no peer package needed):

- flash-attention tests/test_flash_attn.py: `construct_local_mask`, `attn_bias_from_alibi_slopes`,
  `attention_ref` (window_size=(left, right), causal on real lengths in a padded batch, symmetric
  ALiBi with (B, H) slopes) and varlen (per-sequence bottom-right causal/window);
- xformers ops/fmha/attn_bias.py: `LocalAttentionFromBottomRightMask`, `BlockDiagonalMask`,
  `BlockDiagonalCausalMask`, `...FromBottomRightMask`, `...LocalAttentionMask` materialised.
"""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks

# -- the peers' definitions (float64) --


def flash_local_mask(sq_pad, sk_pad, window, qpm=None, kpm=None):
    """flash-attention's construct_local_mask: True = masked out; (B|1, 1, L, S)."""
    row = torch.arange(sq_pad)[:, None]
    col = torch.arange(sk_pad)
    sk = sk_pad if kpm is None else kpm.sum(-1)[:, None, None, None]
    sq = sq_pad if qpm is None else qpm.sum(-1)[:, None, None, None]
    if window[0] < 0:
        return torch.as_tensor(col > row + sk - sq + window[1])
    sk = torch.full_like(col, sk_pad) if kpm is None else sk
    return (col > torch.minimum(row + sk - sq + window[1], torch.as_tensor(sk))) | (
        col < row + sk - sq - window[0])


def flash_alibi_bias(slopes, sq_pad, sk_pad, qpm=None, kpm=None, causal=False):
    """flash-attention's attn_bias_from_alibi_slopes; slopes (B, H)."""
    s = slopes.double()[:, :, None, None]
    if causal:
        return torch.arange(-sk_pad + 1, 1, dtype=torch.float64) * s
    row = torch.arange(sq_pad)[:, None]
    col = torch.arange(sk_pad)
    sk = sk_pad if kpm is None else kpm.sum(-1)[:, None, None, None]
    sq = sq_pad if qpm is None else qpm.sum(-1)[:, None, None, None]
    return -s * torch.abs(row + sk - sq - col).double()


def flash_attention_ref(q, k, v, qpm=None, kpm=None, bias=None, causal=False, window=(-1, -1)):
    """flash-attention's attention_ref in float64, (B, H, L, D) layout."""
    if causal:
        window = (window[0], 0)
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if kpm is not None:
        s = s.masked_fill(~kpm[:, None, None, :], float("-inf"))
    local = None
    if window[0] >= 0 or window[1] >= 0:
        local = flash_local_mask(q.shape[2], k.shape[2], window, qpm, kpm)
        s = s.masked_fill(local, float("-inf"))
    if bias is not None:
        s = s + bias
    a = torch.softmax(s, dim=-1)
    if local is not None:
        a = a.masked_fill(local.all(-1, keepdim=True), 0.0)
    if qpm is not None:
        a = a.masked_fill(~qpm[:, None, :, None], 0.0)
    out = a @ v
    if qpm is not None:
        out = out.masked_fill(~qpm[:, None, :, None], 0.0)
    return torch.nan_to_num(out, nan=0.0)  # a row with no key at all: 0, as attnlab


def xformers_local_bottom_right(L, S, left, right):
    """xformers LocalAttentionFromBottomRightMask(left, right).materialize: True = attend."""
    m = torch.ones(L, S)
    shift = S - L
    m = torch.triu(m, diagonal=shift - left)
    return torch.tril(m, diagonal=shift + right).bool()


def xformers_causal_block(L, S, from_bottom_right, window=None):
    """xformers _materialize_causal_mask: True = attend."""
    shift = S - L if from_bottom_right else 0
    m = torch.tril(torch.ones(L, S), diagonal=shift)
    if window is not None:
        m = torch.triu(m, diagonal=shift - window + 1)
    return m.bool()


def xformers_block_diagonal(q_lens, k_lens, block):
    """xformers BlockDiagonal*Mask.materialize: each block from block(ql, kl); True = attend."""
    m = torch.zeros(sum(q_lens), sum(k_lens), dtype=torch.bool)
    qs = ks = 0
    for ql, kl in zip(q_lens, k_lens):
        m[qs:qs + ql, ks:ks + kl] = block(ql, kl)
        qs, ks = qs + ql, ks + kl
    return m


def dense_attention(q, k, v, allowed, bias=None):
    """float64 softmax attention; a row with nothing allowed gives 0."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.nan_to_num(torch.softmax(s, -1), nan=0.0) @ v


def inputs(B, H, L, S, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, D, generator=g, dtype=torch.float64) for n in (L, S, S))


BACKENDS = ["math", "tiled", "sdpa", "reference"]


def check_backends(q, k, v, want, backends=BACKENDS, **kw):
    for backend in backends:
        out = attnlab.attention(q, k, v, backend=backend, **kw)
        err = (out - want).abs().max().item()
        assert err < 1e-10, f"{backend}: max diff {err:.3e} against the peer's reference"


# -- two-sided windows --

WINDOWS = [(0, 0), (2, 3), (5, 0), (0, 4), (-1, 2), (3, -1), (40, 1)]
SHAPES = [(13, 13), (7, 19), (19, 7), (1, 9), (33, 64)]


@pytest.mark.parametrize("left,right", WINDOWS)
@pytest.mark.parametrize("L,S", SHAPES)
def test_window_is_flash_window_size(left, right, L, S):
    if left < 0 and right < 0:
        pytest.skip("no window")
    # flash's kernels read -1 as unbounded; its reference only does so for the left reach
    ref = (left, right) if left < 0 or right >= 0 else (left, L + S)
    want_masked = flash_local_mask(L, S, ref)  # (L, S)
    m = masks.window(left, right, align="bottom_right")
    assert torch.equal(m.to_dense(L, S)[0, 0], ~want_masked)
    q, k, v = inputs(2, 2, L, S)
    want = flash_attention_ref(q, k, v, window=ref)
    check_backends(q, k, v, want, mask=m)


@pytest.mark.parametrize("left,right", [(0, 0), (2, 3), (6, 1), (1, 8)])
@pytest.mark.parametrize("L,S", SHAPES)
def test_window_is_xformers_local_from_bottom_right(left, right, L, S):
    got = masks.window(left, right, align="bottom_right").to_dense(L, S)[0, 0]
    assert torch.equal(got, xformers_local_bottom_right(L, S, left, right))


def test_window_top_left_and_its_special_cases():
    L, S = 11, 17
    i, j = torch.arange(L)[:, None], torch.arange(S)
    got = masks.window(3, 2).to_dense(L, S)[0, 0]
    assert torch.equal(got, (j >= i - 3) & (j <= i + 2))
    assert torch.equal(masks.window(None, 0).to_dense(L, S), masks.causal().to_dense(L, S))
    assert torch.equal(masks.window(4, 0, "bottom_right").to_dense(L, S),
                       masks.sliding_window(5, "bottom_right").to_dense(L, S))
    assert masks.window(None, 0).simplified(L, S).is_top_left_causal
    assert masks.window(None, None).simplified(L, S) is None


# -- causal and windows on each sequence's real lengths --

def padding_masks(q_lens, k_lens, L, S):
    return (torch.arange(L) < torch.tensor(q_lens)[:, None],
            torch.arange(S) < torch.tensor(k_lens)[:, None])


@pytest.mark.parametrize("L,S,q_lens,k_lens", [
    (9, 9, [9, 4, 6], [9, 7, 3]),
    (5, 17, [5, 2, 1], [17, 9, 12]),  # KV-cache style, L > 1 new tokens per sequence
    (16, 8, [16, 11, 3], [8, 8, 5]),
])
@pytest.mark.parametrize("window", [(-1, -1), (3, 0), (2, 2)])
def test_ragged_alignment_is_flash_on_padded_batch(L, S, q_lens, k_lens, window):
    qpm, kpm = padding_masks(q_lens, k_lens, L, S)
    q, k, v = inputs(3, 2, L, S, seed=1)
    if window == (-1, -1):  # causal=True in flash-attention: bottom-right on the real lengths
        want = flash_attention_ref(q, k, v, qpm, kpm, causal=True)
        m = masks.ragged_causal(q_lens, k_lens)
    else:
        want = flash_attention_ref(q, k, v, qpm, kpm, window=window)
        m = masks.window(*window, align="bottom_right", query_lengths=q_lens, key_lengths=k_lens)
    m = m & masks.padding(key_lengths=k_lens, query_lengths=q_lens)
    check_backends(q, k, v, want, mask=m)


def test_ragged_causal_differs_from_padded_alignment():
    """The reason it exists: causal('bottom_right') aligns on the padded S - L."""
    L, S, q_lens, k_lens = 4, 10, [4, 2], [10, 5]
    ragged = masks.ragged_causal(q_lens, k_lens).to_dense(L, S)
    padded = masks.causal("bottom_right").to_dense(L, S)
    assert torch.equal(ragged[0], padded[0])  # a full sequence: the same
    assert not torch.equal(ragged[1], padded[0])
    assert bool(ragged[1, 0, 0, 3]) and not bool(ragged[1, 0, 0, 4])  # 0 + 5 - 2 = 3


# -- ALiBi: symmetric, per-batch slopes, on real lengths --

@pytest.mark.parametrize("L,S", [(9, 9), (6, 13), (13, 6)])
@pytest.mark.parametrize("ragged", [False, True])
def test_symmetric_alibi_is_flash_non_causal(L, S, ragged):
    B, H = 3, 2
    slopes = torch.rand(B, H, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    q, k, v = inputs(B, H, L, S, seed=3)
    if ragged:
        q_lens, k_lens = [L, max(1, L - 3), 2], [S, S - 2, max(1, S - 5)]
        qpm, kpm = padding_masks(q_lens, k_lens, L, S)
        mod = masks.alibi(slopes, symmetric=True, align="bottom_right",
                          query_lengths=q_lens, key_lengths=k_lens)
        m = masks.padding(key_lengths=k_lens, query_lengths=q_lens)
    else:
        qpm = kpm = None
        mod, m = masks.alibi(slopes, symmetric=True, align="bottom_right"), None
    bias = flash_alibi_bias(slopes, L, S, qpm, kpm)
    want = flash_attention_ref(q, k, v, qpm, kpm, bias=bias)
    # the modifier's own values are the peer's bias
    b, h = torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None]
    i, j = torch.arange(L)[None, None, :, None], torch.arange(S)[None, None, None, :]
    from attnlab.ops.problem import Dims
    bound = mod.bind(Dims(batch=(B,), H=H, Hkv=H, L=L, S=S, D=16, Dv=16), "cpu")
    got = bound(torch.zeros(B, H, L, S, dtype=torch.float64), b, h, i, j)
    live = (torch.ones(B, 1, L, S, dtype=torch.bool) if qpm is None
            else qpm[:, None, :, None] & kpm[:, None, None, :])
    assert torch.equal(got.masked_fill(~live, 0), bias.expand(B, H, L, S).masked_fill(~live, 0))
    check_backends(q, k, v, want, backends=["math", "tiled", "reference"], mask=m, score_mod=mod)


@pytest.mark.parametrize("L,S", [(9, 9), (6, 13)])
def test_causal_alibi_matches_flash_output(L, S):
    """flash-attention's causal bias slope·(j - S + 1) differs from the causal form by a constant
    per row: the same output."""
    B, H = 2, 3
    slopes = torch.rand(B, H, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    q, k, v = inputs(B, H, L, S, seed=5)
    want = flash_attention_ref(q, k, v, bias=flash_alibi_bias(slopes, L, S, causal=True),
                               causal=True)
    mod = masks.alibi(slopes, align="bottom_right")
    check_backends(q, k, v, want, backends=["math", "tiled"], mask=masks.causal("bottom_right"),
                   score_mod=mod)


def test_alibi_checks_its_shapes():
    from attnlab.errors import AttnlabError
    from attnlab.ops.problem import Dims
    d = Dims(batch=(2,), H=4, Hkv=4, L=3, S=3, D=8, Dv=8)
    with pytest.raises(AttnlabError, match="alibi slopes"):
        masks.alibi(torch.ones(3)).bind(d, "cpu")
    with pytest.raises(AttnlabError, match="alibi slopes"):
        masks.alibi(torch.ones(3, 4)).bind(d, "cpu")
    with pytest.raises(AttnlabError, match="slopes"):
        masks.alibi(torch.ones(4, dtype=torch.int64))
    with pytest.raises(AttnlabError, match="align"):
        masks.alibi(torch.ones(4), query_lengths=[1, 2])


# -- block-diagonal masks with their own query and key lengths --

BLOCKS = [([3, 5, 2], [4, 2, 6]), ([1, 7], [7, 1]), ([4, 4, 4], [4, 4, 4]), ([6], [2])]


@pytest.mark.parametrize("q_lens,k_lens", BLOCKS)
@pytest.mark.parametrize("kind", ["plain", "causal", "causal_br", "local", "local_br"])
def test_block_diagonal_is_xformers(q_lens, k_lens, kind):
    blk = {
        "plain": lambda ql, kl: torch.ones(ql, kl, dtype=torch.bool),
        "causal": lambda ql, kl: xformers_causal_block(ql, kl, False),
        "causal_br": lambda ql, kl: xformers_causal_block(ql, kl, True),
        "local": lambda ql, kl: xformers_causal_block(ql, kl, False, window=3),
        "local_br": lambda ql, kl: xformers_causal_block(ql, kl, True, window=3),
    }[kind]
    mine = {
        "plain": lambda: masks.block_diagonal(q_lens, k_lens),
        "causal": lambda: masks.block_causal(q_lens, k_lens),
        "causal_br": lambda: masks.block_causal(q_lens, k_lens, align="bottom_right"),
        "local": lambda: masks.block_causal(q_lens, k_lens, window=3),
        "local_br": lambda: masks.block_causal(q_lens, k_lens, "bottom_right", window=3),
    }[kind]()
    want = xformers_block_diagonal(q_lens, k_lens, blk)
    L, S = want.shape
    assert torch.equal(mine.to_dense(L, S)[0, 0], want)
    q, k, v = inputs(1, 2, L, S, seed=6)
    check_backends(q, k, v, dense_attention(q, k, v, want), mask=mine)


@pytest.mark.parametrize("q_lens,k_lens", BLOCKS)
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (2, 1), (0, 3)])
def test_block_diagonal_is_flash_varlen(q_lens, k_lens, window):
    """flash_attn_varlen_func(cu_seqlens_q, cu_seqlens_k, causal / window_size): attention_ref
    on each sequence alone, bottom-right aligned within it."""
    L, S = sum(q_lens), sum(k_lens)
    q, k, v = inputs(1, 2, L, S, seed=7)
    parts, qs, ks = [], 0, 0
    for ql, kl in zip(q_lens, k_lens):
        parts.append(flash_attention_ref(q[:, :, qs:qs + ql], k[:, :, ks:ks + kl],
                                         v[:, :, ks:ks + kl], window=window))
        qs, ks = qs + ql, ks + kl
    want = torch.cat(parts, dim=2)
    m = masks.block_diagonal(q_lens, k_lens, left=window[0], right=window[1],
                             align="bottom_right")
    check_backends(q, k, v, want, mask=m)


def test_block_diagonal_padding_past_the_last_sequence():
    m = masks.block_causal([2, 3], [3, 2])
    d = m.to_dense(7, 8)[0, 0]
    assert not d[5:].any() and not d[:, 5:].any()
    with pytest.raises(attnlab.AttnlabError, match="query_lengths"):
        m.check(4, 8)
    with pytest.raises(attnlab.AttnlabError, match="key_lengths"):
        masks.block_causal([2], [1, 2])


def test_block_causal_is_not_causal_and_document():
    """causal() & document() puts the diagonal at global positions: wrong when L_g != S_g."""
    q_lens, k_lens = [2, 3], [4, 1]
    seg_q = torch.repeat_interleave(torch.arange(2), torch.tensor(q_lens))
    seg_k = torch.repeat_interleave(torch.arange(2), torch.tensor(k_lens))
    L, S = 5, 5
    naive = (masks.causal() & masks.document(seg_q, seg_k)).to_dense(L, S)
    mine = masks.block_causal(q_lens, k_lens).to_dense(L, S)
    want = xformers_block_diagonal(q_lens, k_lens, lambda a, b: xformers_causal_block(a, b, False))
    assert torch.equal(mine[0, 0], want) and not torch.equal(naive[0, 0], want)
