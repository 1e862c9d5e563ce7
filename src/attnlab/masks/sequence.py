"""Masks that depend on the batch: padding (ragged lengths), document (packed sequences) and the
key prefix every query sees (prefix_lm's prefix), with the checks of their lengths and ids."""

from __future__ import annotations

import torch

from attnlab.errors import AttnlabError, fmt_shape
from attnlab.masks.base import Mask, classify, pick


class KeyPrefix(Mask):
    """Every query sees keys j < prefix_length (per batch element when a sequence is given)."""

    def __init__(self, prefix_length):
        lengths = _lengths("prefix_length", prefix_length)
        self.lengths = lengths  # (Bm,)
        self.batch_size = lengths.numel()

    def _block(self, rows, cols, L, S):
        n = self.lengths.to(cols.device)[:, None, None, None]  # (Bm, 1, 1, 1)
        return (cols[None, None, None, :] < n).expand(-1, 1, len(rows), len(cols))

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, L, S):
        n = self.lengths.to(k_lo.device)[:, None, None, None]
        return classify((k_hi < n).expand(-1, 1, q_lo.shape[0], -1),
                        (k_lo >= n).expand(-1, 1, q_lo.shape[0], -1))

    def _intervals(self, L, S, device):
        n = self.lengths.to(device)[:, None, None]  # (Bm, 1, 1)
        return torch.zeros_like(n), n

    def mask_mod(self, L, S, device=None):
        n, pb = self.lengths.to(device), pick(self.lengths.numel())  # (Bm,)
        return lambda b, h, q, k: k < n[pb(b)]

    def __repr__(self):
        return f"key_prefix({self.lengths.tolist()})"


def _lengths(name: str, x) -> torch.Tensor:
    """A 1-D int64 tensor of non-negative lengths from an int or a flat sequence/tensor of ints."""
    t = as_int_tensor(name, x, "integer lengths")
    if t.dim() > 1:
        raise AttnlabError(
            f"{name}: expected an int or a flat sequence of ints (one per batch element), got "
            f"shape {tuple(t.shape)}"
        )
    t = t.reshape(-1)
    if t.numel() == 0:
        raise AttnlabError(f"{name}: expected at least one length, got an empty sequence")
    if (t < 0).any():
        raise AttnlabError(f"{name}: expected lengths >= 0, got {t.tolist()}"[:200])
    return t


def as_int_tensor(name: str, x, what: str) -> torch.Tensor:
    """x as a new int64 tensor (a copy: the caller may write into x afterwards), or AttnlabError
    naming `name` (strings, ragged nesting, floats, integers beyond int64 are refused)."""
    if isinstance(x, (str, bytes)) or (isinstance(x, torch.Tensor) and x.device.type == "meta"):
        raise AttnlabError(f"{name}: expected {what}, got {x!r}"[:200])
    try:
        t = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        why = "an integer beyond int64" if "overflow" in str(e).lower() else "not a regular " \
            "nesting of ints"
        raise AttnlabError(f"{name}: expected {what}, got {why}: {x!r}"[:200]) from None
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise AttnlabError(f"{name}: expected {what}, got dtype {t.dtype}")
    return t.detach().to(torch.int64, copy=True)


class Padding(Mask):
    """Key j is real when j < key_lengths[b]; query i is real when i < query_lengths[b].

    A padded query row attends to nothing, so its output is 0 (never NaN).
    """

    def __init__(self, key_lengths=None, query_lengths=None):
        if key_lengths is None and query_lengths is None:
            raise AttnlabError("padding: pass key_lengths, query_lengths or both")
        self.key_lengths = None if key_lengths is None else _lengths("key_lengths", key_lengths)
        self.query_lengths = (
            None if query_lengths is None else _lengths("query_lengths", query_lengths)
        )
        sizes = {t.numel() for t in (self.key_lengths, self.query_lengths) if t is not None}
        if len(sizes) > 1 and 1 not in sizes:
            raise AttnlabError(
                f"padding: key_lengths has {self.key_lengths.numel()} entries but query_lengths "
                f"has {self.query_lengths.numel()}; expected one per batch element"
            )
        self.batch_size = max(sizes)

    def _limits(self, device):
        big = torch.iinfo(torch.int64).max
        kl = self.key_lengths if self.key_lengths is not None else torch.tensor([big])
        ql = self.query_lengths if self.query_lengths is not None else torch.tensor([big])
        return kl.to(device)[:, None, None, None], ql.to(device)[:, None, None, None]

    def _block(self, rows, cols, L, S):
        kl, ql = self._limits(cols.device)  # (Bm, 1, 1, 1) each
        return (cols[None, None, None, :] < kl) & (rows[None, None, :, None] < ql)

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, L, S):
        kl, ql = self._limits(k_lo.device)
        full = (k_hi < kl) & (q_hi < ql)  # (Bm, 1, nQ, nK)
        empty = (k_lo >= kl) | (q_lo >= ql)
        return classify(*torch.broadcast_tensors(full, empty))

    def mask_mod(self, L, S, device=None):
        kl, ql = (t.reshape(-1) for t in self._limits(device))  # (Bm|1,) each, on their own
        pk, pq = pick(kl.numel()), pick(ql.numel())
        return lambda b, h, q, k: (k < kl[pk(b)]) & (q < ql[pq(b)])

    def _intervals(self, L, S, device):
        kl, ql = (x[..., 0] for x in self._limits(device))  # (Bm, 1, 1) each
        rows = torch.arange(L, device=device)  # (L,)
        hi = torch.where(rows < ql, kl.clamp(max=S), 0)  # padded query rows see nothing
        return torch.zeros_like(hi), hi

    def __repr__(self):
        kl = None if self.key_lengths is None else self.key_lengths.tolist()
        ql = None if self.query_lengths is None else self.query_lengths.tolist()
        return f"padding(key_lengths={kl}, query_lengths={ql})"


def _segments(name: str, x) -> torch.Tensor:
    t = as_int_tensor(name, x, "integer segment ids")
    if t.dim() == 1:
        t = t[None]
    if t.dim() != 2:
        raise AttnlabError(f"{name}: expected shape (L,) or (B, L), got {fmt_shape(t.shape)}")
    return t


def _block_ranges(seg: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor):
    """min and max segment id within each block [lo, hi] of every row of seg (B, N); block ids
    from searchsorted, so no block size is read back from the device, and blocks may start
    anywhere (a context-parallel block's tiles start at its offset)."""
    B, N = seg.shape
    n = lo.numel()
    big = torch.iinfo(torch.int64).max
    lo_id = torch.full((B, n + 1), big, dtype=seg.dtype, device=seg.device)
    hi_id = torch.full((B, n + 1), -big - 1, dtype=seg.dtype, device=seg.device)
    if n == 0:
        return lo_id[:, :0], hi_id[:, :0]
    pos = torch.arange(N, device=seg.device, dtype=lo.dtype)
    blk = torch.searchsorted(lo.contiguous(), pos, right=True) - 1  # (N,): block of each position
    inside = (blk >= 0) & (pos <= hi[blk.clamp(min=0)])
    blk = torch.where(inside, blk, n).expand(B, N)  # positions in no block go to a spare slot
    lo_id.scatter_reduce_(1, blk, seg, "amin")
    hi_id.scatter_reduce_(1, blk, seg, "amax")
    return lo_id[:, :n], hi_id[:, :n]


class Document(Mask):
    """Packed sequences: query i sees key j only when both lie in the same segment (document).

    `segment_ids` has shape (L,) or (B, L); `kv_segment_ids` (default: the same ids) has (S,) or
    (B, S). Combine with `causal()` for packed causal language modelling.
    """

    def __init__(self, segment_ids, kv_segment_ids=None):
        self.q_seg = _segments("segment_ids", segment_ids)
        self.kv_seg = self.q_seg if kv_segment_ids is None else _segments(
            "kv_segment_ids", kv_segment_ids)
        bq, bk = self.q_seg.shape[0], self.kv_seg.shape[0]
        if bq != bk and 1 not in (bq, bk):
            raise AttnlabError(
                f"kv_segment_ids: batch {bk} does not match segment_ids batch {bq}"
            )
        self.batch_size = max(bq, bk)

    def check(self, L, S):
        if self.q_seg.shape[1] != L:
            raise AttnlabError(
                f"segment_ids: expected one id per query position (L = {L}), "
                f"got shape {fmt_shape(self.q_seg.shape)}"
            )
        if self.kv_seg.shape[1] != S:
            raise AttnlabError(
                f"kv_segment_ids: expected one id per key position (S = {S}), "
                f"got shape {fmt_shape(self.kv_seg.shape)}"
            )

    def _block(self, rows, cols, L, S):
        q = self.q_seg.to(rows.device)[:, rows]  # (Bm, Lb)
        k = self.kv_seg.to(cols.device)[:, cols]  # (Bm, Sb)
        return (q[:, :, None] == k[:, None, :])[:, None]  # (Bm, 1, Lb, Sb)

    def _tiles(self, q_lo, q_hi, k_lo, k_hi, L, S):
        q_min, q_max = _block_ranges(self.q_seg.to(q_lo.device), q_lo[:, 0], q_hi[:, 0])
        k_min, k_max = _block_ranges(self.kv_seg.to(k_lo.device), k_lo[0], k_hi[0])
        q_min, q_max = q_min[:, :, None], q_max[:, :, None]  # (Bm, nQ, 1)
        k_min, k_max = k_min[:, None, :], k_max[:, None, :]  # (Bm, 1, nK)
        full = (q_min == q_max) & (k_min == k_max) & (q_min == k_min)
        empty = (q_max < k_min) | (k_max < q_min)
        return classify(*torch.broadcast_tensors(full, empty))[:, None]  # (Bm, 1, nQ, nK)

    def mask_mod(self, L, S, device=None):
        qs, ks = self.q_seg.to(device), self.kv_seg.to(device)  # (Bm|1, L), (Bm|1, S)
        pq, pk = pick(qs.shape[0]), pick(ks.shape[0])
        return lambda b, h, q, k: qs[pq(b), q] == ks[pk(b), k]

    def _intervals(self, L, S, device):
        """Each key segment must be one run of equal ids; a query's interval is its id's run."""
        q_seg, kv_seg = self.q_seg.to(device), self.kv_seg.to(device)
        B = max(q_seg.shape[0], kv_seg.shape[0])
        lo = torch.zeros(B, 1, L, dtype=torch.int64, device=device)
        hi = torch.zeros_like(lo)
        for b in range(B):
            ids, qs = kv_seg[b % kv_seg.shape[0]], q_seg[b % q_seg.shape[0]]
            if ids.numel() == 0:
                continue
            starts = torch.cat([ids.new_ones(1, dtype=torch.bool), ids[1:] != ids[:-1]])
            first = starts.nonzero()[:, 0]  # (runs,) where each run of equal ids starts
            run_ids = ids[first]
            order = torch.argsort(run_ids)
            sorted_ids = run_ids[order]
            if bool((sorted_ids[1:] == sorted_ids[:-1]).any()):
                return None  # an id in two runs: its keys are not one interval
            ends = torch.cat([first[1:], first.new_tensor([S])])
            at = torch.searchsorted(sorted_ids, qs).clamp(max=len(order) - 1)
            found = sorted_ids[at] == qs
            run = order[at]
            lo[b, 0] = torch.where(found, first[run], 0)
            hi[b, 0] = torch.where(found, ends[run], 0)
        return lo, hi

    def __repr__(self):
        return f"document(segment_ids of shape {fmt_shape(self.q_seg.shape)})"


def padding(key_lengths=None, query_lengths=None) -> Padding:
    """Mask out padded keys (j >= key_lengths[b]) and padded queries (i >= query_lengths[b])."""
    return Padding(key_lengths, query_lengths)


def document(segment_ids, kv_segment_ids=None) -> Document:
    """Packed sequences: attend only within the same segment id."""
    return Document(segment_ids, kv_segment_ids)
