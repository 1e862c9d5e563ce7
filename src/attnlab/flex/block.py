"""A torch BlockMask as an attnlab Mask: its blocks decide, its mask_mod fills in the partial ones.

A BlockMask (from torch's `create_block_mask`, `BlockMask.from_kv_blocks`, or attnlab's Flex
backend) lists, per (batch, head, query block), the key blocks to visit (`kv_indices`, the first
`kv_num_blocks`) and among them those needing no mask at all (`full_kv_indices`). Compiled Flex
skips every other block and applies `mask_mod` only in the listed partial ones; `BlockMaskMask`
means exactly that:

    allowed(b, h, i, j) = FULL block  or  (PARTIAL block  and  mask_mod(b, h, i, j))

Its tile classes come from the lists alone, re-tiled to whatever block sizes a kernel asks for
(no mask_mod call); its per-row key intervals come from one evaluation of mask_mod on the
partial blocks only (`_intervals`), so an interval-shaped mask (sliding window, document,
prefix-LM ...) runs on the interval kernel, and a sparse one costs its partial blocks, not L·S.

Caution: torch's eager (uncompiled) flex_attention ignores the block lists and evaluates
mask_mod everywhere; for a BlockMask whose blocks agree with its mask_mod (every one made by
create_block_mask) the two agree. attnlab follows the blocks, as compiled Flex does.
"""

from __future__ import annotations

import torch

from attnlab.errors import AttnlabError
from attnlab.masks import EMPTY, FULL, PARTIAL, Mask
from attnlab.masks.base import block_bounds, classify


def classes_of(bm) -> torch.Tensor:
    """int8 (Bm, Hm, nQ, nK) tile classes of a BlockMask, on its device."""
    L, S = bm.seq_lengths
    bq, bk = _sizes(bm)
    nq, nk = -(-L // bq), -(-S // bk)
    partial = _listed(bm.kv_num_blocks, bm.kv_indices, nq, nk)
    out = torch.where(partial, PARTIAL, EMPTY).to(torch.int8)
    if bm.full_kv_num_blocks is not None:
        full = _listed(bm.full_kv_num_blocks, bm.full_kv_indices, nq, nk)
        out = torch.where(full, torch.tensor(FULL, dtype=torch.int8, device=out.device), out)
    return out


def _sizes(bm) -> tuple[int, int]:
    size = bm.BLOCK_SIZE
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def _listed(num: torch.Tensor, idx: torch.Tensor, nq: int, nk: int) -> torch.Tensor:
    """bool (Bm, Hm, nQ, nK): the blocks listed by counts num (Bm, Hm, nQ) and indices idx
    (Bm, Hm, nQ, K) (entries past the count, or past nK, list nothing)."""
    num, idx = num[..., :nq], idx[..., :nq, :]
    valid = torch.arange(idx.shape[-1], device=idx.device) < num[..., None]  # (Bm, Hm, nQ, K)
    valid &= (idx >= 0) & (idx < nk)
    where = torch.where(valid, idx, nk).long()  # unlisted entries go to a spare column
    out = torch.zeros(*idx.shape[:-1], nk + 1, dtype=torch.bool, device=idx.device)
    return out.scatter_(-1, where, True)[..., :nk]


class BlockMaskMask(Mask):
    """The mask a BlockMask describes (see the module docstring); `fn` is its mask_mod in
    attnlab's broadcast convention (`attnlab.flexfn`)."""

    def __init__(self, bm, fn):
        self.L, self.S = (int(n) for n in bm.seq_lengths)
        self.bq, self.bk = _sizes(bm)
        self.classes = classes_of(bm)  # (Bm, Hm, nQ, nK)
        self.batch_size, self.heads = (int(n) for n in self.classes.shape[:2])
        self.fn = fn
        self._tile_cache: dict = {}

    def for_call(self, B: int, H: int) -> Mask:
        """This mask as a call with B batch elements and H heads evaluates it: a BlockMask made
        for every batch element or head (B=None / H=None in create_block_mask) still runs its
        mask_mod at each b and h of the call in its partial blocks, as Flex's kernels do, when
        the mask_mod reads them (kept per (B, H))."""
        rb, rh = self.reads()
        want = (B if rb and self.batch_size == 1 else self.batch_size,
                H if rh and self.heads == 1 else self.heads)
        if want == (self.batch_size, self.heads):
            return self
        key = ("for_call", want)
        if key not in self._tile_cache:
            got = object.__new__(BlockMaskMask)
            got.__dict__.update(self.__dict__)
            got.batch_size, got.heads = want
            got.classes = self.classes.expand(*want, *self.classes.shape[2:])
            got._tile_cache = {}
            self._tile_cache[key] = got
        return self._tile_cache[key]

    def reads(self) -> tuple[bool, bool]:
        """(mask_mod reads b, reads h), from the shape it returns on b (2, 1, 1, 1), h (1, 2, 1,
        1) (zeros); a mask_mod in the vmap form is taken to read both."""
        if "reads" not in self._tile_cache:
            z = lambda *s: torch.zeros(*s, dtype=torch.int64, device=self.classes.device)  # noqa: E731
            out = self.fn(z(2, 1, 1, 1), z(1, 2, 1, 1), z(1, 1, 1, 1), z(1, 1, 1, 1))
            shape = (1,) * (4 - out.dim()) + tuple(out.shape)
            self._tile_cache["reads"] = (shape[0] > 1, shape[1] > 1)
        return self._tile_cache["reads"]

    def check(self, L, S):
        if (L, S) != (self.L, self.S):
            raise AttnlabError(
                f"block_mask: made for (Q_LEN, KV_LEN) = ({self.L}, {self.S}), got query and key "
                f"lengths ({L}, {S}); make a BlockMask for these lengths")

    def _block(self, rows, cols, L, S):
        dev = rows.device
        cls = self.classes.to(dev)
        cls = cls[:, :, rows // self.bq][:, :, :, cols // self.bk]  # (Bm, Hm, R, C)
        b = torch.arange(self.batch_size, device=dev)[:, None, None, None]  # (Bm, 1, 1, 1)
        h = torch.arange(self.heads, device=dev)[None, :, None, None]  # (1, Hm, 1, 1)
        got = self.fn(b, h, rows[None, None, :, None], cols[None, None, None, :])
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool:
            raise AttnlabError(f"mask_mod: must return a bool tensor, got "
                               f"{getattr(got, 'dtype', type(got).__name__)}")
        return (cls == FULL) | ((cls == PARTIAL) & got)

    def tiles(self, L, S, block_q, block_k, device=None):
        """Exact classes: from the row intervals where the mask has them (`band_tiles`), else
        the block lists re-tiled and the tiles that leaves PARTIAL evaluated (PARTIAL blocks
        only: EMPTY and FULL ones never call mask_mod)."""
        dev = self.classes.device if device is None else torch.device(device)
        key = (L, S, block_q, block_k, str(dev))
        if key not in self._tile_cache:
            self.check(L, S)
            iv = self.intervals(L, S, device=dev)
            if iv is not None:
                from attnlab.masks.band import band_tiles

                lo, hi = (x.long().expand(self.batch_size, self.heads, L) for x in iv)
                k_lo, k_hi = block_bounds(S, block_k, dev)
                t = band_tiles(lo, hi, torch.arange(0, L, block_q, device=dev), k_lo, k_hi)
            else:
                t = retile(self.classes, L, S, (self.bq, self.bk), (block_q, block_k)).to(dev)
                t = self._refined(t.expand(self.batch_size, self.heads, *t.shape[2:]).clone(),
                                  block_q, block_k)
            self._tile_cache[key] = t
        return self._tile_cache[key]

    def _refined(self, t: torch.Tensor, bq: int, bk: int) -> torch.Tensor:
        """t (Bm, Hm, nQ, nK) with its PARTIAL tiles evaluated: EMPTY / FULL where they are."""
        dev = t.device
        for a in range(t.shape[2]):
            part = t[:, :, a] == PARTIAL  # (Bm, Hm, nK)
            blocks = part.any(0).any(0).nonzero().flatten()
            if not blocks.numel():
                continue
            cols = (blocks[:, None] * bk + torch.arange(bk, device=dev)).flatten()
            cols = cols[cols < self.S]  # (C,) the keys of those tiles, ascending
            rows = torch.arange(a * bq, min(self.L, (a + 1) * bq), device=dev)
            u = self.block(rows, cols, self.L, self.S).to(torch.uint8)  # (Bm, Hm, R, C)
            Bm, Hm, _, C = u.shape
            idx = (cols // bk).expand(Bm, Hm, C)
            nk = t.shape[3]
            hit = u.new_zeros(Bm, Hm, nk).scatter_reduce_(2, idx, u.amax(2), "amax")
            every = u.new_ones(Bm, Hm, nk).scatter_reduce_(2, idx, u.amin(2), "amin")
            t[:, :, a] = torch.where(part, classify(every.bool(), hit == 0), t[:, :, a])
        return t

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, L, S):  # inside `&` / `|`: sizes from the bounds
        bq = int(q_hi[0, 0] - q_lo[0, 0]) + 1 if q_lo.numel() else 1
        bk = int(k_hi[0, 0] - k_lo[0, 0]) + 1 if k_lo.numel() else 1
        return self.tiles(L, S, bq, bk, q_lo.device)

    def memo(self, key) -> dict:
        """A store kernels keep data derived from this mask in (as `FunctionMask.memo`)."""
        return self._tile_cache.setdefault(("memo", key), {})

    def _intervals(self, L, S, device):
        return row_intervals(self, device)

    def __repr__(self):
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        return (f"BlockMaskMask({name}, seq_lengths=({self.L}, {self.S}), "
                f"BLOCK_SIZE=({self.bq}, {self.bk}))")


def retile(classes: torch.Tensor, L: int, S: int, old: tuple[int, int],
           new: tuple[int, int]) -> torch.Tensor:
    """Classes (Bm, Hm, nQ, nK) of old-size tiles as classes of new-size tiles: EMPTY where
    every overlapped old tile is EMPTY, FULL where every one is FULL, else PARTIAL."""
    if old == new:
        return classes
    sq, dq = _segments(L, old[0], new[0], classes.device)
    sk, dk = _segments(S, old[1], new[1], classes.device)
    g = classes[:, :, sq][:, :, :, sk]  # (Bm, Hm, segments along L, segments along S)
    nq, nk = -(-L // new[0]), -(-S // new[1])
    hit = _reduce((g != EMPTY).to(torch.uint8), dq, dk, nq, nk, "amax")
    every = _reduce((g == FULL).to(torch.uint8), dq, dk, nq, nk, "amin")
    out = torch.where(hit == 0, EMPTY, torch.where(every == 1, FULL, PARTIAL))
    return out.to(torch.int8)


def _segments(n: int, old: int, new: int, device):
    """(old tile, new tile) of each piece the two tilings cut range(n) into."""
    starts = torch.unique(torch.cat([torch.arange(0, n, old), torch.arange(0, n, new)]))
    return (starts // old).to(device), (starts // new).to(device)


def _reduce(x: torch.Tensor, dq, dk, nq: int, nk: int, how: str) -> torch.Tensor:
    """x (Bm, Hm, a, b) reduced into (Bm, Hm, nq, nk) by row groups dq (a,), column groups dk."""
    Bm, Hm, a, b = x.shape
    init = 0 if how == "amax" else 1
    rows = x.new_full((Bm, Hm, nq, b), init).scatter_reduce_(
        2, dq[None, None, :, None].expand(Bm, Hm, a, b), x, how)
    return x.new_full((Bm, Hm, nq, nk), init).scatter_reduce_(
        3, dk[None, None, None, :].expand(Bm, Hm, nq, b), rows, how)


def row_intervals(m: BlockMaskMask, device):
    """(lo, hi) int64 (Bm, Hm, L) when every row's keys are one interval, else None.

    One pass over the query blocks: FULL blocks count whole (no mask_mod call), mask_mod runs on
    the blocks that are PARTIAL for some batch/head; a row is an interval when its number of
    allowed keys equals last - first + 1."""
    cls = m.classes.to(device)
    Bm, Hm, nq, _ = cls.shape
    lo = torch.zeros(Bm, Hm, m.L, dtype=torch.int64, device=device)
    hi = torch.zeros_like(lo)
    k_lo, k_hi = block_bounds(m.S, m.bk, device)  # (nK,) first / last key of each block
    width = k_hi - k_lo + 1
    for i in range(nq):
        r0, r1 = i * m.bq, min(m.L, (i + 1) * m.bq)
        c = cls[:, :, i]  # (Bm, Hm, nK)
        some = (c == PARTIAL).any(0).any(0)  # (nK,): evaluate these blocks
        full = (c == FULL) & ~some  # counted whole
        big = torch.iinfo(torch.int64).max
        count = (full * width).sum(-1)[..., None]  # (Bm, Hm, 1)
        first = torch.where(full, k_lo, big).amin(-1)[..., None]
        last = torch.where(full, k_hi, -1).amax(-1)[..., None]
        blocks = some.nonzero().flatten()
        if blocks.numel():
            cols = (k_lo[blocks, None] + torch.arange(m.bk, device=device)).flatten()
            cols = cols[cols < m.S]  # (C,) the keys of those blocks, ascending
            rows = torch.arange(r0, r1, device=device)
            got = m.block(rows, cols, m.L, m.S)  # (Bm, Hm, R, C)
            n = got.sum(-1)  # (Bm, Hm, R)
            f = cols[got.to(torch.uint8).argmax(-1)]
            back = got.flip(-1).to(torch.uint8).argmax(-1)
            e = cols[cols.numel() - 1 - back]
            count = count + n
            first = torch.where(n > 0, torch.minimum(first, f), first)
            last = torch.where(n > 0, torch.maximum(last, e), last)
        count, first, last = (x.expand(Bm, Hm, r1 - r0) for x in (count, first, last))
        live = count > 0
        if bool((live & (count != last - first + 1)).any()):
            return None
        lo[:, :, r0:r1] = torch.where(live, first, 0)
        hi[:, :, r0:r1] = torch.where(live, last + 1, 0)
    return lo, hi
