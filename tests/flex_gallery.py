"""Flex functions as their authors wrote them for torch's Flex, restated: attention-gym's masks
(attn_gym/masks) and mods (attn_gym/mods), and the score_mods / mask_mods of PyTorch's
FlexAttention tests (test/inductor/test_flex_attention.py). Each is written the way Flex users
write them (scalar indices under vmap); several only work on scalars (Flamingo's interval
lookup, MLA's torch.dot, a reduction over a captured row).

`CASES`: name -> Case(mask_mod or None, score_mod or None, sizes). `dense_reference` computes a
call the obvious way (every pair, functions under vmap as Flex's eager path calls them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# ---- attention-gym's masks, restated --------------------------------------------------------


def causal(b, h, q, kv):
    return q >= kv


def sliding_window(window):
    """Causal, looking back at most `window` tokens (gym's sliding_window)."""
    def mask(b, h, q, kv):
        return (q >= kv) & (q - kv <= window)
    return mask


def prefix_lm(prefix):
    """The first `prefix` keys seen by all, causal beyond (gym's prefix_lm)."""
    def mask(b, h, q, kv):
        return (kv < prefix) | (q >= kv)
    return mask


def documents(lengths, inner):
    """Packed documents: attend inside one's own document, `inner` applied to the positions
    within the document (gym's document_mask)."""
    starts = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))

    def mask(b, h, q, kv):
        same = doc[q] == doc[kv]
        return same & inner(b, h, q - starts[doc[q]], kv - starts[doc[kv]])
    return mask


def groups_of(size, inner):
    """Tokens in consecutive groups of `size`: attend inside one's group, `inner` on the offsets
    inside the group (gym's batchify)."""
    def mask(b, h, q, kv):
        return (q // size == kv // size) & inner(b, h, q % size, kv % size)
    return mask


def dilated(window, step):
    """Keys within `window` either side, every `step`-th one (gym's dilated sliding window)."""
    def mask(b, h, q, kv):
        d = (q - kv).abs()
        return (d <= window) & (d % step == 0)
    return mask


def flamingo(spans, tokens_per_image):
    """Text token q sees image i's tokens when spans[i][0] <= q < spans[i][1] (gym's Flamingo
    cross-attention: a row lookup then `[0]`, which only works on scalars)."""
    image_of = torch.repeat_interleave(torch.arange(spans.shape[0]), tokens_per_image)

    def mask(b, h, q, kv):
        span = spans[image_of[kv]]
        return (q >= span[0]) & (q < span[1])
    return mask


def neighbourhood(width, height, kw, kh):
    """NATTEN: a kw×kh window on a width×height canvas, centred on the query, kept inside the
    canvas (gym's natten)."""
    def mask(b, h, q, kv):
        qx, qy, kx, ky = q // width, q % width, kv // width, kv % width
        cx = qx.clamp(kw // 2, (width - 1) - kw // 2)
        cy = qy.clamp(kh // 2, (height - 1) - kh // 2)
        return ((cx - kx).abs() <= kw // 2) & ((cy - ky).abs() <= kh // 2)
    return mask


def tiled_neighbourhood(W, H, kw, kh, tw, th):
    """NATTEN with the canvas stored tile by tile (tw×th tiles; gym's tiled natten)."""
    def xy(i):
        t, off = i // (tw * th), i % (tw * th)
        ty, tx = t // (W // tw), t % (W // tw)
        return tx * tw + off % tw, ty * th + off // tw

    def mask(b, h, q, kv):
        qx, qy = xy(q)
        kx, ky = xy(kv)
        cx = qx.clamp(kw // 2, (W - 1) - kw // 2)
        cy = qy.clamp(kh // 2, (H - 1) - kh // 2)
        return ((cx - kx).abs() <= kw // 2) & ((cy - ky).abs() <= kh // 2)
    return mask


def _spread(x):  # the bits of a 16-bit x at the even positions of 32
    x = x & 0xFFFF
    for shift, keep in ((8, 0x00FF00FF), (4, 0x0F0F0F0F), (2, 0x33333333), (1, 0x55555555)):
        x = (x | (x << shift)) & keep
    return x


def _gather(code):  # the inverse of _spread
    code = code & 0x55555555
    for shift, keep in ((1, 0x33333333), (2, 0x0F0F0F0F), (4, 0x00FF00FF), (8, 0x0000FFFF)):
        code = (code | (code >> shift)) & keep
    return code


def morton_neighbourhood(width, height, kw, kh):
    """NATTEN on a canvas stored along a Z-order (Morton) curve (gym's morton natten)."""
    def mask(b, h, q, kv):
        qx, qy, kx, ky = _gather(q), _gather(q >> 1), _gather(kv), _gather(kv >> 1)
        cx = qx.clamp(kw // 2, (width - 1) - kw // 2)
        cy = qy.clamp(kh // 2, (height - 1) - kh // 2)
        return ((cx - kx).abs() <= kw // 2) & ((cy - ky).abs() <= kh // 2)
    return mask


def sink_window(window, sinks):
    """Causal; a window of `window` back plus the first `sinks` keys (gym's sink_attn)."""
    def mask(b, h, q, kv):
        return ((q - kv <= window) | (kv < sinks)) & (q >= kv)
    return mask


def sliding_tiles_2d(canvas, kernel, tile, text):
    """Sliding Tile Attention on a 2-D canvas of tiles, plus `text` tokens after the image that
    everyone sees and that see everything (gym's sta, 2-D)."""
    (ch, cw), (kh, kw), (th, tw) = canvas, kernel, tile
    tiles_h, tiles_w, kth, ktw = ch // th, cw // tw, kh // th, kw // tw
    vision = ch * cw

    def tile_of(i):
        t = i // (th * tw)
        return t // tiles_w, t % tiles_w

    def mask(b, h, q, kv):
        qh, qw = tile_of(q)
        kh_, kw_ = tile_of(kv)
        lh, rh = kth // 2, kth // 2 + (kth % 2 - 1)
        lw, rw = ktw // 2, ktw // 2 + (ktw % 2 - 1)
        mh = qh.clamp(lh, tiles_h - 1 - rh)
        mw = qw.clamp(lw, tiles_w - 1 - rw)
        near = (kh_ >= mh - lh) & (kh_ <= mh + rh) & (kw_ >= mw - lw) & (kw_ <= mw + rw)
        both = (q < vision) & (kv < vision)
        to_text = (q < vision) & (kv >= vision) & (kv < vision + text)
        from_text = (q >= vision) & (kv < vision + text)
        return (both & near) | to_text | from_text
    return mask


def sliding_tiles_3d(canvas, kernel, tile, text):
    """Sliding Tile Attention on a (time, height, width) canvas of tiles, plus `text` tokens
    after the video (gym's sta, 3-D)."""
    (ct, ch, cw), (kt, kh, kw), (tt, th, tw) = canvas, kernel, tile
    nt, nh, nw = ct // tt, ch // th, cw // tw
    kts, khs, kws = kt // tt, kh // th, kw // tw
    vision = ct * ch * cw

    def tile_of(i):
        t = i // (tt * th * tw)
        return t // (nh * nw), (t % (nh * nw)) // nw, t % nw

    def near(qa, ka, k, n):
        left, right = k // 2, k // 2 + (k % 2 - 1)
        centre = qa.clamp(left, n - 1 - right)
        return (ka >= centre - left) & (ka <= centre + right)

    def mask(b, h, q, kv):
        qt, qh, qw = tile_of(q)
        k_t, k_h, k_w = tile_of(kv)
        close = near(qt, k_t, kts, nt) & near(qh, k_h, khs, nh) & near(qw, k_w, kws, nw)
        both = (q < vision) & (kv < vision)
        to_text = (q < vision) & (kv >= vision) & (kv < vision + text)
        from_text = (q >= vision) & (kv < vision + text)
        return (both & close) | to_text | from_text
    return mask


def spatial_head(prompt, per_frame, width, sink, round_to):
    """Sparse VideoGen's spatial head: prompt rows and columns, plus a band of `width` frames
    rounded down to `round_to` (gym's svg spatial head, Python math on Python ints)."""
    def mask(b, h, q, kv):
        rows = q < prompt
        cols = kv < (prompt + per_frame if sink else prompt)
        band = math.floor(width * per_frame / round_to) * round_to
        return cols | rows | ((q - kv).abs() < band)
    return mask


def temporal_head(prompt, frames, per_frame, width):
    """Sparse VideoGen's temporal head: same position in nearby frames (gym's svg temporal)."""
    def mask(b, h, q, kv):
        band = (width * per_frame) // frames
        near = ((q - prompt) % per_frame - (kv - prompt) % per_frame).abs() < band
        return (kv < prompt) | (q < prompt) | near
    return mask


def longformer(window, is_global):
    """A symmetric window plus global tokens that see and are seen by all (gym's global
    sliding window)."""
    def mask(b, h, q, kv):
        return ((q - kv).abs() <= window) | is_global[q] | is_global[kv]
    return mask


def shared_prefix(lengths, prefix_of):
    """Packed prompt/continuation documents: causal inside one's document, a continuation also
    sees its whole prompt document (gym's shared_prefix)."""
    starts = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    prefix_of = torch.tensor(prefix_of)

    def mask(b, h, q, kv):
        d = doc[q]
        p = prefix_of[d]
        own = (kv >= starts[d]) & (q >= kv)
        prompt = (d != p) & (kv >= starts[p]) & (kv < starts[p + 1])
        return own | prompt
    return mask


def block_diffusion(n, block):
    """BD3-LM training over 2n tokens, noised then clean: noised tokens see their own noised
    block and earlier clean blocks, clean ones earlier-or-same clean blocks (gym's
    block_diffusion)."""
    def mask(b, h, q, kv):
        qn, kn = q < n, kv < n
        qb, kb = (q % n) // block, (kv % n) // block
        return ((qb == kb) & (qn == kn)) | ((qb > kb) & qn & ~kn) | ((qb >= kb) & ~qn & ~kn)
    return mask


def tree_causal(prefix, parents):
    """JetSpec tree drafting: every query (a tree node) sees the prefix keys and its own
    root-to-self path among the tree's keys (gym's jetspec tree-causal)."""
    n = len(parents)
    anc = torch.eye(n, dtype=torch.bool)
    for node, parent in enumerate(parents[1:], start=1):
        anc[node] |= anc[parent]

    def mask(b, h, q, kv):
        t = (kv - prefix).clamp(min=0, max=n - 1)
        return (kv < prefix) | ((kv >= prefix) & (kv < prefix + n) & anc[q, t])
    return mask


def draft_blocks(prefix, block):
    """JetSpec draft-head training: the prefix, then causal inside one's own sampled block of
    keys (gym's jetspec training mask)."""
    def mask(b, h, q, kv):
        rel = kv - prefix
        same = (kv >= prefix) & (q // block == rel // block) & (rel % block <= q % block)
        return (kv < prefix) | same
    return mask


# ---- attention-gym's mods, restated ---------------------------------------------------------


def sandwich(heads, max_len, d_bar=16):
    """Sandwich: a cosine relative-distance table, scaled per head (gym's sandwich)."""
    freqs = 1.0 / 10000 ** (2 * torch.arange(d_bar // 2, dtype=torch.float32) / d_bar)
    dist = torch.arange(2 * max_len - 1, dtype=torch.float32) - (max_len - 1)
    table = torch.cos(dist.abs()[:, None] * freqs).sum(-1)  # (2·max_len - 1,)
    per_head = heads / (8.0 * torch.arange(1, heads + 1, dtype=torch.float32))

    def mod(score, b, h, q, kv):
        return score + table[q - kv + max_len - 1] * per_head[h]
    return mod


def graph_distance_bias(table, dist):
    """Graphormer's spatial encoding: a learned (H, buckets) table at each pair's shortest-path
    bucket dist (B, N, N) (gym's graphormer)."""
    def mod(score, b, h, q, kv):
        return score + table[h, dist[b, q, kv]]
    return mod


def graph_edge_bias(table, path_types, path_lengths):
    """Graphormer's edge encoding: the mean over a pair's shortest-path positions of a learned
    (H, K, edge types) table at each position's edge type (gym's graphormer edge bias; gym
    slices the table per position when building the function, for compiled Flex's one gather
    per trained tensor, so it must be rebuilt per step; here the slices are taken per call)."""
    def mod(score, b, h, q, kv):
        n_hops = path_lengths[b, q, kv]
        total = 0.0
        for n in range(path_types.shape[-1]):
            t = table[:, n]
            total = total + torch.where(n_hops > n, t[h, path_types[b, q, kv, n]], 0.0)
        return score + total / torch.clamp(n_hops, min=1)
    return mod


def activation(fn=torch.nn.functional.gelu, offset=1.0):
    """softmax replaced by fn through log(fn(s) + offset) (gym's activation)."""
    def mod(score, b, h, q, kv):
        return torch.log(fn(score) + offset)
    return mod



def alibi(heads):
    """ALiBi with slopes 2^(-8(h+1)/H) (gym's alibi)."""
    def mod(score, b, h, q, kv):
        return score + (kv - q) * torch.exp2(-((h + 1) * 8.0 / heads))
    return mod


def softcap(cap):
    """Gemma 2 / Grok tanh soft-capping (gym's softcapping)."""
    def mod(score, b, h, q, kv):
        return cap * torch.tanh(score / cap)
    return mod


def mla_rope(q_rope, k_rope, heads, weight=1.0):
    """DeepSeek-V2 MLA: a RoPE dot product added per pair (gym's latent_attention: torch.dot of
    two rows, a scalar-only form)."""
    def mod(score, b, h, q, kv):
        return score + weight * torch.dot(q_rope[b, h, q], k_rope[b, h // heads, kv])
    return mod


# ---- PyTorch's FlexAttention test functions, restated ---------------------------------------


def identity(score, b, h, q, kv):
    return score


def times_two(score, b, h, q, kv):
    return score * 2


def squared(score, b, h, q, kv):
    return score * score


def causal_score(score, b, h, q, kv):
    return torch.where(q >= kv, score, float("-inf"))


def inverse_causal_score(score, b, h, q, kv):
    return torch.where(q <= kv, score, float("-inf"))


def inverse_causal(b, h, q, kv):
    return q <= kv


def rel_bias(score, b, h, q, kv):
    return score + (q - kv)


def rel_causal(score, b, h, q, kv):
    return torch.where(q >= kv, score + (q - kv), float("-inf"))


def windowed(offset):
    def mod(score, b, h, q, kv):
        return torch.where(q + offset >= kv, score, float("-inf"))
    return mod


def trig(score, b, h, q, kv):
    return torch.sin(torch.cos(score)) + torch.tan(b)


def trig2(score, b, h, q, kv):
    c, s = torch.cos(score), torch.sin(score)
    return c * s + torch.tan(b)


def head_offset(table):
    """A captured per-head factor (torch's captured-buffer test)."""
    def mod(score, b, h, q, kv):
        return score * table[h]
    return mod


def batch_reduced(table):
    """A captured (B, 8) table whose row of b is summed: `.sum()` of a row, scalar-only."""
    def mod(score, b, h, q, kv):
        return score + table[b].sum()
    return mod


# ---- the cases ------------------------------------------------------------------------------


@dataclass
class Case:
    mask_mod: object = None
    score_mod: object = None
    L: int = 97
    S: int = 113
    H: int = 4
    Hkv: int = 4
    B: int = 2
    mask_bh: bool = False  # create_block_mask(B, H) instead of (None, None)
    captured: tuple = ()  # tensors score_mod reads that get a gradient


def _table(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


_QR, _KR = _table(2, 4, 97, 8, seed=1), _table(2, 1, 97, 8, seed=2)
_HEADS, _ROWS = _table(4, seed=3), _table(2, 8, seed=4)
_SPANS = torch.tensor([[0, 40], [20, 70], [70, 97]])
_GLOBAL = torch.zeros(150, dtype=torch.bool)
_GLOBAL[[0, 77, 149]] = True
_GRAPH = torch.randint(0, 6, (2, 90, 90), generator=torch.Generator().manual_seed(5))
_BUCKETS = _table(4, 6, seed=6)
_EDGES = _table(4, 3, 5, seed=7)  # (H, K path positions, edge types)
_PATH_TYPES = torch.randint(0, 5, (2, 70, 70, 3), generator=torch.Generator().manual_seed(8))
_PATH_LENGTHS = torch.randint(0, 5, (2, 70, 70), generator=torch.Generator().manual_seed(9))


def _cases():
    c = {
        # attention-gym masks
        "gym causal": Case(causal, L=130, S=130),
        "gym sliding_window": Case(sliding_window(40), L=300, S=300),
        "gym prefix_lm": Case(prefix_lm(30), L=200, S=200),
        "gym document causal": Case(documents([50, 90, 7, 53], causal), L=200, S=200),
        "gym batchify": Case(groups_of(24, causal), L=120, S=120),
        "gym dilated_sliding_window": Case(dilated(12, 3), L=150, S=150),
        "gym flamingo": Case(flamingo(_SPANS, 11), L=97, S=33),
        "gym natten": Case(neighbourhood(12, 12, 5, 3), L=144, S=144),
        "gym tiled natten": Case(tiled_neighbourhood(12, 12, 5, 5, 4, 4), L=144, S=144),
        "gym morton natten": Case(morton_neighbourhood(8, 8, 3, 3), L=64, S=64),
        "gym sink": Case(sink_window(20, 4), L=160, S=160),
        "gym sta 2d": Case(sliding_tiles_2d((12, 12), (6, 6), (3, 3), 16), L=160, S=160),
        "gym sta 3d": Case(sliding_tiles_3d((4, 6, 6), (2, 6, 3), (2, 3, 3), 10), L=154, S=154),
        "gym svg spatial": Case(spatial_head(6, 14, 2, True, 4), L=146, S=146),
        "gym svg temporal": Case(temporal_head(6, 10, 14, 2), L=146, S=146),
        "gym global_sliding_window": Case(longformer(9, _GLOBAL), L=150, S=150),
        "gym shared_prefix": Case(shared_prefix([40, 30, 30, 50, 20, 30], [0, 0, 0, 3, 3, 3]),
                                  L=200, S=200),
        "gym block_diffusion": Case(block_diffusion(80, 16), L=160, S=160),
        "gym jetspec tree": Case(tree_causal(40, [-1, 0, 1, 1, 3, 3, 0, *range(6, 66)]),
                                 L=67, S=107),
        "gym jetspec training": Case(draft_blocks(30, 12), L=96, S=126),
        # attention-gym mods
        "gym alibi": Case(causal, alibi(4), L=120, S=120),
        "gym softcap": Case(None, softcap(2.0)),
        "gym mla rope": Case(None, mla_rope(_QR, _KR, 4), L=97, S=97),
        "gym sandwich": Case(causal, sandwich(4, 120), L=120, S=120),
        "gym graphormer": Case(None, graph_distance_bias(_BUCKETS, _GRAPH), L=90, S=90,
                               captured=(_BUCKETS,)),
        "gym activation gelu": Case(None, activation()),
        "gym graphormer edges": Case(None, graph_edge_bias(_EDGES, _PATH_TYPES, _PATH_LENGTHS),
                                     L=70, S=70, captured=(_EDGES,)),
        # PyTorch's Flex tests
        "torch identity": Case(None, identity),
        "torch times_two": Case(None, times_two),
        "torch squared": Case(None, squared),
        "torch causal": Case(causal, causal_score, L=113, S=113),
        "torch inverse_causal": Case(inverse_causal, inverse_causal_score, L=97, S=113),
        "torch rel_bias": Case(None, rel_bias),
        "torch rel_causal": Case(causal, rel_causal, L=113, S=113),
        "torch alibi gqa": Case(None, alibi(8), H=8, Hkv=2),
        "torch windowed": Case(None, windowed(30)),
        "torch trig": Case(None, trig),
        "torch trig2": Case(None, trig2),
        "torch head_offset": Case(None, head_offset(_HEADS), captured=(_HEADS,)),
        "torch buffer_reduced": Case(None, batch_reduced(_ROWS), captured=(_ROWS,)),
        "torch per-head mask": Case(lambda b, h, q, kv: (q >= kv) | (h % 2 == 1) & (b == 0),
                                    L=130, S=130, mask_bh=True),
    }
    return c


CASES = _cases()


def vmap4(fn, score: bool):
    """fn over (b, h, q_idx, kv_idx) as Flex's eager path maps it."""
    lead = (0,) if score else ()
    for dims in ((None, None, None, 0), (None, None, 0, None), (None, 0, None, None),
                 (0, None, None, None)):
        fn = torch.vmap(fn, in_dims=lead + dims)
    return fn


def dense_reference(q, k, v, mask_mod=None, score_mod=None, scale=None):
    """(out, lse): every pair's score, score_mod and mask_mod under vmap, softmax, borrow; in
    the inputs' dtype (float64 for the oracle, float32 for the plain same-dtype one)."""
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    k, v = k.expand(B, *k.shape[1:]), v.expand(B, *v.shape[1:])
    s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    idx = [torch.arange(n) for n in (B, H, L, S)]
    if score_mod is not None:
        s = vmap4(score_mod, True)(s, *idx).to(s.dtype)
    if mask_mod is not None:
        s = torch.where(vmap4(mask_mod, False)(*idx), s, float("-inf"))
    lse = torch.logsumexp(s, -1)
    w = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return w @ v, lse


def gallery_rows() -> list[str]:
    """The docs' gallery table ("Coming from FlexAttention"): per case, the form each function
    took and the path flex_attention runs (fp32, the case's sizes, gradients on)."""
    from attnlab.flex import api, create_block_mask

    rows = []
    for name, c in CASES.items():
        g = torch.Generator().manual_seed(0)
        q = torch.randn(c.B, c.H, c.L, 16, generator=g).requires_grad_()
        k, v = (torch.randn(c.B, c.Hkv, c.S, 16, generator=g) for _ in range(2))
        bm = None
        if c.mask_mod is not None:
            B, H = (c.B, c.H) if c.mask_bh else (None, None)
            bm = create_block_mask(c.mask_mod, B, H, c.L, c.S, device="cpu")
        choice = api.select_backend(q, k, v, score_mod=c.score_mod, block_mask=bm,
                                    enable_gqa=c.Hkv != c.H)
        fn = getattr(api.mask_of(bm, q, k), "fn", None)
        mod = api.mod_of(c.score_mod)
        fused = None if mod is None else api.fused_of(c.score_mod, mod, q)
        forms = [f"{what}: {x.form}" for what, x in (("mask_mod", fn), ("score_mod", mod))
                 if x is not None and not (what == "score_mod" and fused)]
        if fused:
            forms.append("score_mod: fused as " + " and ".join(
                f"softcap={v:g}" if k == "softcap" else "ALiBi" for k, v in fused.items()))
        rows.append(f"| {name} | {', '.join(forms)} | {choice.backend} |")
    return rows
