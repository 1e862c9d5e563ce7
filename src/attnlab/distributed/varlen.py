"""Packed sequences across ranks: documents given as `cu_seqlens`-style offsets, each split over
the ranks head and tail (as torch's head-tail load balancer does for document masks), so every
rank gets an even share of every document's causal work.

    >>> cu = [0, 700, 2000, 4096]                                   # three documents
    >>> q_local = cp.varlen_shard(q, cu)                            # (B, H, L_local, D)
    >>> out = cp.varlen_attention(q_local, k_local, v_local, cu)    # causal inside each document

Layout: document d (tokens cu[d] … cu[d+1] − 1) is cut into 2P chunks of ceil(n_d / 2P) tokens
(the last ones cut short or empty); rank r holds chunks r and 2P − 1 − r of every document, in
document order. The mask is the document mask of the offsets (causal inside each document unless
causal=False), on global positions; the strategies are the ordinary ones ("ring", "allgather",
"ulysses", "auto") on `VarlenGeometry`, whose transfer sets and work are exact per document:
rank r needs key j of document d when one of its queries in d may attend it (causal: when it
holds a query of d at or after j), and a pair of pieces from two documents is never computed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise

import torch

from attnlab import masks
from attnlab.distributed import api, comm, cost, validate
from attnlab.distributed.attend import Call
from attnlab.distributed.gather import GatherAttention
from attnlab.distributed.geometry import Geometry
from attnlab.distributed.layouts import Piece
from attnlab.distributed.ring import RingAttention
from attnlab.distributed.ulysses import ulysses_attention
from attnlab.errors import AttnlabError, check_scale
from attnlab.masks import EMPTY, FULL, PARTIAL

LAYOUT = "documents"
CHOICES = ("auto", "ring", "allgather", "ulysses")


def check_cu_seqlens(cu_seqlens) -> tuple[int, ...]:
    """The offsets as a tuple of ints: 0 first, never decreasing, at least one document."""
    if isinstance(cu_seqlens, torch.Tensor):
        cu_seqlens = cu_seqlens.tolist()
    try:
        ok = all(isinstance(x, int) and not isinstance(x, bool) for x in cu_seqlens)
        cu = tuple(cu_seqlens) if ok else ()
    except TypeError:
        cu, ok = (), False
    if not ok or len(cu) < 2 or cu[0] != 0 or any(b < a for a, b in pairwise(cu)) \
            or cu[-1] < 1:
        raise AttnlabError(f"cu_seqlens: expected int offsets 0 = c0 <= c1 <= ... <= cN (N >= 1 "
                           f"documents, cN >= 1 tokens), got {cu_seqlens!r:.120}")
    return cu


@dataclass(frozen=True)
class DocumentSharding:
    """The head-tail split of every document over `world` ranks (duck-types `Sharding`)."""

    cu: tuple[int, ...]
    world: int

    @property
    def n(self) -> int:
        return self.cu[-1]

    @property
    def layout(self) -> str:
        return LAYOUT

    @cached_property
    def _pieces(self) -> list[list[Piece]]:
        P, out = self.world, []
        for r in range(P):
            runs, start = [], 0
            for a, b in pairwise(self.cu):
                c = -(-(b - a) // (2 * P))  # ceil: chunk of this document
                for ch in (r, 2 * P - 1 - r):
                    lo, hi = min(a + ch * c, b), min(a + (ch + 1) * c, b)
                    if hi > lo:
                        runs.append(Piece(start, hi - lo, torch.arange(lo, hi), None))
                        start += hi - lo
            out.append(runs)
        return out

    def pieces(self, rank: int) -> list[Piece]:
        return self._pieces[rank]

    def size(self, rank: int) -> int:
        return sum(p.length for p in self._pieces[rank])

    def positions(self, rank: int) -> torch.Tensor:
        ps = self._pieces[rank]
        return torch.cat([p.positions for p in ps]) if ps else torch.zeros(0, dtype=torch.int64)

    @property
    def n_max(self) -> int:
        return max(1, max(self.size(r) for r in range(self.world)))

    @property
    def chunk(self) -> int:  # not chunked by the sequence: no tile grid of the layout's chunks
        return self.n_max

    def chunks_of(self, rank: int) -> list[int]:
        return []

    def owner_order(self) -> torch.Tensor:
        """(n,) int64: each global token's row in the rank-concatenated padded shards."""
        order = torch.empty(self.n, dtype=torch.int64)
        for r in range(self.world):
            pos = self.positions(r)
            order[pos] = r * self.n_max + torch.arange(len(pos))
        return order

    @cached_property
    def doc_of(self) -> torch.Tensor:
        """(n,) int64: the document of each token."""
        lengths = torch.tensor([b - a for a, b in pairwise(self.cu)])
        return torch.repeat_interleave(torch.arange(len(lengths)), lengths)


@dataclass
class VarlenGeometry(Geometry):
    """Geometry of packed documents over `world` ranks: transfer sets and work exact per
    document (key_block 1), piece pairs classed by document and position."""

    cu: tuple[int, ...] = (0, 1)
    causal: bool = True

    @cached_property
    def q(self) -> DocumentSharding:
        return DocumentSharding(self.cu, self.world)

    @cached_property
    def k(self) -> DocumentSharding:
        return self.q

    @cached_property
    def chunk_classes(self):
        return None

    @cached_property
    def key_block(self) -> int:
        return 1

    def pair_class(self, qp: Piece, kp: Piece) -> int:
        doc = self.q.doc_of
        if qp.length == 0 or kp.length == 0 or doc[qp.positions[0]] != doc[kp.positions[0]]:
            return EMPTY  # a piece lies in one document
        if not self.causal or int(kp.positions[-1]) <= int(qp.positions[0]):
            return FULL
        return EMPTY if int(kp.positions[0]) > int(qp.positions[-1]) else PARTIAL

    @cached_property
    def need_blocks(self) -> torch.Tensor:
        """bool (world, S): rank r has a query that may attend key j."""
        P, S, doc = self.world, self.S, self.q.doc_of
        need = torch.zeros(P, S, dtype=torch.bool)
        for r in range(P):
            pos = self.q.positions(r)
            if not len(pos):
                continue
            # the last (causal) or any query position of rank r in each document, or -1
            last = torch.full((len(self.cu) - 1,), -1, dtype=torch.int64)
            last.scatter_reduce_(0, doc[pos], pos, reduce="amax")
            j = torch.arange(S)
            lim = last[doc]  # (S,)
            need[r] = (lim >= j) if self.causal else (lim >= 0)
        return need

    def _keys_per_block(self, nkb: int) -> torch.Tensor:
        """int64 (S, P): one key per block (key_block 1): 1 where rank s holds key j."""
        out = torch.zeros(nkb, self.world, dtype=torch.int64)
        for s in range(self.world):
            out[self.k.positions(s), s] = 1
        return out

    def work_pairs(self) -> list[float]:
        """Attended (query, key) pairs per rank, exactly: causal, a query at offset o of its
        document attends o + 1 keys; otherwise the whole document."""
        start = torch.tensor(self.cu[:-1])[self.q.doc_of]  # (n,) first token of each's document
        end = torch.tensor(self.cu[1:])[self.q.doc_of]
        per = (torch.arange(self.L) - start + 1) if self.causal else (end - start)
        return [float(per[self.q.positions(r)].sum()) for r in range(self.world)]


def _mask(cu, causal: bool):
    sh = DocumentSharding(cu, 1)
    return cost.effective_mask(masks.document(sh.doc_of), causal)


def _geometry(cu, world: int, causal: bool) -> VarlenGeometry:
    L = cu[-1]
    return VarlenGeometry(L, L, world, LAYOUT, _mask(cu, causal), cu=cu, causal=causal)


def varlen_plan(cu_seqlens, H: int, Hkv: int, D: int, world: int, *, causal: bool = True,
                dtype=torch.bfloat16, batch: int = 1, Dv: int | None = None,
                link_gbps: float = cost.DEFAULT_LINK_GBPS, tflops: float = cost.DEFAULT_TFLOPS,
                latency_us: float = cost.DEFAULT_LATENCY_US, calibration=None) -> cost.Plan:
    """`plan` for `varlen_attention`: every strategy's bytes, messages, FLOPs, load, time."""
    cu = check_cu_seqlens(cu_seqlens)
    base = cost.plan(cu[-1], H, Hkv, D, world, dtype=dtype, batch=batch, Dv=Dv,
                     link_gbps=link_gbps, tflops=tflops, latency_us=latency_us,
                     calibration=calibration)  # validates the sizes and numbers
    link, _, tf, lat = cost.links(link_gbps, None, None, tflops, latency_us, calibration)
    geom = _geometry(cu, world, bool(causal))
    dtype = cost.DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    est = cost.estimate(geom, B=batch, H=H, Hkv=Hkv, D=D, Dv=D if Dv is None else Dv,
                        dtype=dtype, link_gbps=link, tflops=tf, latency_us=lat)
    ch = cost.choose(est)
    return cost.Plan(base.L, base.S, world, LAYOUT, repr(geom.mask), est, ch.strategy, ch.reason)


def varlen_shard(x: torch.Tensor, cu_seqlens, *, group=None, dim: int = -2) -> torch.Tensor:
    """This rank's rows of the packed tensor `x` (the same on every rank), along `dim`."""
    cu = check_cu_seqlens(cu_seqlens)
    if x.shape[dim] != cu[-1]:
        raise AttnlabError(f"x: expected {cu[-1]} rows (cu_seqlens[-1]) along dim {dim}, got "
                           f"{x.shape[dim]}")
    rank, world = comm.rank_world(group)
    return x.index_select(dim, DocumentSharding(cu, world).positions(rank).to(x.device))


def varlen_unshard(x_local: torch.Tensor, cu_seqlens, *, group=None, dim: int = -2):
    """The whole packed tensor on every rank, from each rank's rows (no autograd)."""
    cu = check_cu_seqlens(cu_seqlens)
    rank, world = comm.rank_world(group)
    sh = DocumentSharding(cu, world)
    if x_local.shape[dim] != sh.size(rank):
        raise AttnlabError(f"x_local: rank {rank} holds {x_local.shape[dim]} rows along dim "
                           f"{dim}; cu_seqlens over {world} ranks gives it {sh.size(rank)}")
    if world == 1:
        return x_local
    x = x_local.detach().movedim(dim, 0).contiguous()  # (n, ...)
    part = torch.cat([x, x.new_zeros(sh.n_max - x.shape[0], *x.shape[1:])])  # (n_max, ...)
    out = part.new_empty(world * sh.n_max, *x.shape[1:])
    comm.all_gather(out.view(-1), part.view(-1), group, "unshard")  # (P·n_max, ...)
    return out.index_select(0, sh.owner_order().to(x.device)).movedim(0, dim)


def varlen_attention(query, key, value, cu_seqlens, *, group=None, strategy: str = "auto",
                     causal: bool = True, scale: float | None = None, enable_gqa: bool = False,
                     softcap: float | None = None, return_lse: bool = False, calibration=None):
    """Attention of packed documents split over the ranks of `group`, exactly as one process
    with the document mask of `cu_seqlens` (causal inside each document unless causal=False).

    Args:
        query: (B, H, L_local, D), this rank's rows of the packed sequence (`varlen_shard`).
        key: (B, Hkv, L_local, D); value: (B, Hkv, L_local, Dv).
        cu_seqlens: offsets of the documents, 0 = c0 <= c1 <= ... <= cN = L (a list or an int
            tensor), the same on every rank.
        strategy: "ring", "allgather", "ulysses" or "auto".
        scale, enable_gqa, softcap, return_lse, calibration: as `context_parallel_attention`.

    Raises:
        AttnlabError: on every rank alike, when any rank's input is bad or the calls differ.
    """
    rank, world = comm.rank_world(group)
    try:
        cu = check_cu_seqlens(cu_seqlens)
        err = None
    except AttnlabError as e:
        cu, err = (0, 1), str(e)
    m = _mask(cu, bool(causal)) if isinstance(causal, bool) else None
    desc = api._describe(query, key, value, "zigzag", strategy, m, False, scale, enable_gqa,
                         softcap)
    if desc["error"] is None:
        desc["error"] = err or (None if strategy in CHOICES else
                                f"strategy: expected one of {list(CHOICES)}, got {strategy!r}")
    if desc["error"] is None and not isinstance(causal, bool):
        desc["error"] = f"causal: expected a bool, got {causal!r}"
    desc["cu_seqlens"] = hashlib.sha1(repr(cu).encode()).hexdigest()[:16]
    descs = validate.gather_descriptions(desc, group, api._device(query))
    validate.check_agreement(descs)
    geom = _geometry(cu, world, causal)
    rows = [d["rows"][0] for d in descs]
    want = [geom.q.size(r) for r in range(world)]
    if rows != want or [d["rows"][1] for d in descs] != want:
        raise AttnlabError(f"query: ranks hold {rows} rows, cu_seqlens (L = {cu[-1]}) over "
                           f"{world} ranks gives {want}; split with varlen_shard")
    B, H, _, D = query.shape
    Hkv, Dv = key.shape[1], value.shape[-1]
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32
    c = Call(geom, group, rank, world, check_scale(scale, D), softcap, acc)
    est = api._estimates(geom, B, H, Hkv, D, Dv, query.dtype, geom.mask, None, calibration, 0.0)
    if strategy == "auto":
        strategy = cost.choose(est).strategy
    elif not est[strategy].feasible:
        raise AttnlabError(f"strategy: {strategy!r} {est[strategy].why_not}")
    if strategy == "ulysses":
        out, lse = ulysses_attention(query, key, value, c, mask=geom.mask, enable_gqa=enable_gqa)
    else:
        fn = RingAttention if strategy == "ring" else GatherAttention
        out, lse = fn.apply(query, key, value, c)
    return (out, lse) if return_lse else out
