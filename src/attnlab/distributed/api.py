"""The public functions: context_parallel_attention, shard, unshard, and the handle a model gets."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass

import torch

from attnlab.distributed import comm, cost, validate
from attnlab.distributed.attend import Call
from attnlab.distributed.gather import GatherAttention
from attnlab.distributed.geometry import Geometry
from attnlab.distributed.hybrid import hybrid_attention
from attnlab.distributed.layouts import Sharding, check_layout
from attnlab.distributed.ring import RingAttention
from attnlab.distributed.ulysses import ulysses_attention
from attnlab.errors import (
    AttnlabError,
    check_choice,
    check_dropout,
    check_int,
    check_scale,
    check_softcap,
    fmt_shape,
)
from attnlab.masks import Mask
from attnlab.ops.validate import check_qkv

STRATEGY_CHOICES = ("auto", *cost.STRATEGIES)


def context_parallel_attention(query, key, value, *, group=None, layout: str = "zigzag",
                               strategy: str = "auto", mask: Mask | None = None,
                               is_causal: bool = False, scale: float | None = None,
                               enable_gqa: bool = False, softcap: float | None = None,
                               return_lse: bool = False, dropout_p: float = 0.0,
                               dropout_seed: int | None = None, ulysses_size: int | None = None,
                               calibration=None, seq_len=None):
    """Attention over a sequence split across the ranks of `group`, exactly as on one process.

    Every rank passes its shard, in `layout` order (see `shard`):

    Args:
        query: (B, H, L_local, D), this rank's query rows.
        key: (B, Hkv, S_local, D); value: (B, Hkv, S_local, Dv).
        group: a torch.distributed process group (None: the default group; none initialised:
            one process).
        layout: "zigzag" (balanced for causal masks), "contiguous" or "striped".
        strategy: "ring", "allgather", "ulysses", "hybrid" or "auto" (the cost model's pick;
            see `attnlab.distributed.explain`).
        mask: a structured mask from `attnlab.masks` in *global* positions (L × S), the same on
            every rank (a function mask is compared by what it does at L × S).
        is_causal, scale, enable_gqa, softcap: as `attnlab.attention`.
        return_lse: also return the log-sum-exp of each local row, (B, H, L_local).
        dropout_p: attention dropout on the weights, 0 <= p < 1 (survivors scaled by 1/(1 − p);
            the lse is the one before dropout, as `attnlab.attention`). Whether weight
            (b, h, i, j) is dropped is a pure function of (dropout_seed, b, h, global query
            position i, global key position j) (`attnlab.distributed.keyed`), so the answer is
            the same for every world size, layout and strategy, and the backward regenerates
            the mask. Unlike one-process dropout it does not draw from torch's random stream.
            Blocks with dropout run on plain PyTorch ops instead of the fused kernels.
        dropout_seed: the key of the masks, an int (None: drawn from torch's default generator
            on every rank, rank 0's draw used by all).
        ulysses_size: U for strategy "hybrid" (all-to-all over heads inside groups of U
            consecutive ranks, ring across groups; "auto" then weighs it too).
        calibration: a `Calibration` from `attnlab.distributed.calibrate`: "auto" plans with
            its measured link, latency and compute instead of the defaults.
        seq_len: the global sequence length, checked: an int (L = S) or a pair (L, S). Without
            it the global length is the sum of the ranks' shard lengths, so ranks that shard
            sequences of different lengths can pass the layout's size check and compute garbage;
            with it they get an AttnlabError naming the ranks.

    A row that may attend nothing gets output 0 and lse −inf; NaN in keys or values no query may
    attend never reaches the output. Differentiable: gradients reach every rank's q, k, v (all
    ranks must run the backward, as with any collective).

    Raises:
        AttnlabError: on every rank alike, when any rank's input is bad or the ranks' calls
            differ (naming the argument and the ranks).
    """
    rank, world = comm.rank_world(group)
    call_no = comm.next_call()
    if isinstance(mask, Mask) and isinstance(query, torch.Tensor) and query.dim() == 4:
        # a mask function reading b or h is evaluated at the call's batch and heads, as in one
        # process (B and H are whole on every rank: only the sequence is sharded)
        # (whatever fails here, a size mismatch or the user's function on one rank, fails again
        # in the argument check below, where every rank reports it alike: no rank leaves early)
        with contextlib.suppress(Exception):
            mask = mask.for_call(query.shape[0], query.shape[1])
    desc = _describe(query, key, value, layout, strategy, mask, is_causal, scale, enable_gqa,
                     softcap, dropout_p, dropout_seed, seq_len)
    desc["ulysses_size"] = ulysses_size
    if ulysses_size is not None and strategy not in ("hybrid", "auto") and not desc["error"]:
        desc["error"] = (f"ulysses_size: only strategy 'hybrid' (and 'auto', which weighs it) "
                         f"uses it, got ulysses_size={ulysses_size!r} with strategy={strategy!r}")
    with comm.during(call_no, "argument check"):
        descs = validate.gather_descriptions(desc, group, _device(query))
    validate.check_agreement(descs)
    seed = descs[0]["drawn_seed"] if dropout_seed is None else int(dropout_seed)
    L, S = validate.check_rows(descs, layout)
    validate.check_seq_len(seq_len, L, S, descs)
    m = cost.effective_mask(mask, is_causal)
    if m is not None:
        m.check(L, S)
    fp = descs[0]["mask"]
    if validate.by_behaviour(fp):  # a function inside: compare what the masks do at L × S
        with comm.during(call_no, "argument check"):
            fp = (validate.check_behaviour(mask, L, S, group, _device(query)), id(mask))
    B, H, _, D = query.shape
    Hkv, Dv = key.shape[1], value.shape[-1]
    # the call's signature: the same one plans once (geometry and estimates are pure functions
    # of it; the mask enters by its fingerprint, a digest of its parameters; a mask compared by
    # behaviour, by its identity too: the cached geometry holds it, so the id stays its own)
    sig = (L, S, world, layout, fp, bool(is_causal))
    geom = _cached(sig, lambda: Geometry(L, S, world, layout, m))
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32
    c = Call(geom, group, rank, world, check_scale(scale, D), softcap, acc, float(dropout_p),
             seed if dropout_p > 0 else 0, call_no)
    est = _cached((*sig, B, H, Hkv, D, Dv, str(query.dtype), ulysses_size, calibration,
                   float(dropout_p) > 0),
                  lambda: _estimates(geom, B, H, Hkv, D, Dv, query.dtype, m, ulysses_size,
                                     calibration, dropout_p))
    if strategy == "hybrid" and "hybrid" not in est:
        raise AttnlabError("ulysses_size: strategy 'hybrid' needs ulysses_size=U, the ranks "
                           f"of a group (a divisor of world = {world})")
    if strategy == "auto":
        strategy = cost.choose(est).strategy
    elif not est[strategy].feasible:
        raise AttnlabError(f"strategy: {strategy!r} {est[strategy].why_not}")
    if strategy == "ulysses":
        out, lse = ulysses_attention(query, key, value, c, mask=m, enable_gqa=enable_gqa)
    elif strategy == "hybrid":
        out, lse = hybrid_attention(query, key, value, c, U=ulysses_size)
    else:
        fn = RingAttention if strategy == "ring" else GatherAttention
        out, lse = fn.apply(query, key, value, c)
    return (out, lse) if return_lse else out


def _estimates(geom, B, H, Hkv, D, Dv, dtype, m, U, calibration, dropout_p):
    """Every strategy's Estimate for this call ("hybrid" only with a ulysses_size, and not
    under dropout), on the calibration's numbers when given, else the defaults."""
    link, intra, tflops, lat = cost.links(cost.DEFAULT_LINK_GBPS, None, None,
                                          cost.DEFAULT_TFLOPS, cost.DEFAULT_LATENCY_US,
                                          calibration)
    per_head = m is not None and m.heads > 1
    est = cost.estimate(geom, B=B, H=H, Hkv=Hkv, D=D, Dv=Dv, dtype=dtype, link_gbps=link,
                        tflops=tflops, latency_us=lat, per_head_mask=per_head,
                        masked_tflops=getattr(calibration, "masked_tflops", None))
    if U is not None:
        est["hybrid"] = cost.hybrid_estimate(
            geom, B=B, H=H, Hkv=Hkv, D=D, Dv=Dv, dtype=dtype, U=U, intra_gbps=intra,
            inter_gbps=link, tflops=tflops, latency_us=lat, per_head_mask=per_head,
            masked_tflops=getattr(calibration, "masked_tflops", None))
        if dropout_p > 0:
            est["hybrid"] = cost.Estimate("hybrid", False, "does not take attention dropout")
    return est


#: plans (geometries and estimates) of the most recent call signatures of this process
_PLANS: OrderedDict = OrderedDict()
PLAN_CACHE_SIZE = 64


def _cached(key, make):
    """make() once per key, the PLAN_CACHE_SIZE most recent kept (least recently used dropped)."""
    if key in _PLANS:
        _PLANS.move_to_end(key)
        return _PLANS[key]
    _PLANS[key] = val = make()
    if len(_PLANS) > PLAN_CACHE_SIZE:
        _PLANS.popitem(last=False)
    return val


def _device(x):
    return x.device if isinstance(x, torch.Tensor) else None


def _describe(query, key, value, layout, strategy, mask, is_causal, scale, enable_gqa,
              softcap, dropout_p=0.0, dropout_seed=None, seq_len=None) -> dict:
    """This rank's call as plain data, with the error its own inputs raise (if any)."""
    desc: dict = {"error": None, "rows": [0, 0], "drawn_seed": None}
    try:
        check_layout(layout)
        check_choice("strategy", strategy, STRATEGY_CHOICES)
        for name, x in (("query", query), ("key", key), ("value", value)):
            if not isinstance(x, torch.Tensor) or x.dim() != 4:
                got = fmt_shape(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise AttnlabError(f"{name}: expected a 4-D tensor (B, H, L_local, D), got {got}")
        check_qkv(query, key, value, enable_gqa=bool(enable_gqa))
        if mask is not None and not isinstance(mask, Mask):
            raise AttnlabError(f"mask: expected a mask from attnlab.masks, got "
                               f"{type(mask).__name__}")
        if mask is not None and (mask.batch_size not in (1, query.shape[0])
                                 or mask.heads not in (1, query.shape[1])):
            raise AttnlabError(f"mask: {mask!r} covers (Bm, Hm) = ({mask.batch_size}, "
                               f"{mask.heads}), expected 1 or (B, H) = "
                               f"{fmt_shape(query.shape[:2])}")
        if not isinstance(is_causal, bool):
            raise AttnlabError(f"is_causal: expected a bool, got {is_causal!r}")
        check_scale(scale, query.shape[-1])
        check_softcap(softcap)
        check_dropout(dropout_p, below_one=True)
        check_int("dropout_seed", dropout_seed, none=True)
        if dropout_p > 0 and dropout_seed is None:  # every rank draws, so streams advance alike
            desc["drawn_seed"] = int(torch.randint(0, 1 << 62, (1,)).item())
        desc["rows"] = [query.shape[2], key.shape[2]]
        desc.update({
            "query": [query.shape[0], query.shape[1], query.shape[3]],
            "key": [key.shape[0], key.shape[1], key.shape[3]],
            "value": [value.shape[0], value.shape[1], value.shape[3]],
            "dtype": str(query.dtype), "device": query.device.type,
            "requires_grad": torch.is_grad_enabled() and any(
                x.requires_grad for x in (query, key, value)),
        })
    except AttnlabError as e:
        desc["error"] = str(e)
    try:
        validate.seq_len_pair(seq_len)
    except AttnlabError as e:
        desc["error"] = desc["error"] or str(e)
    desc.update({"seq_len": seq_len if not isinstance(seq_len, tuple) else list(seq_len)})
    desc.update({"layout": layout, "strategy": strategy, "mask": validate.fingerprint(mask)
                 if isinstance(mask, Mask) else None, "is_causal": is_causal,
                 "scale": scale, "enable_gqa": bool(enable_gqa), "softcap": softcap,
                 "dropout_p": dropout_p, "dropout_seed": dropout_seed})
    return desc


def shard(x: torch.Tensor, layout: str = "zigzag", *, group=None, dim: int = -2):
    """This rank's part of the whole tensor `x` (the same on every rank), along `dim`."""
    check_layout(layout)
    rank, world = comm.rank_world(group)
    idx = Sharding(x.shape[dim], layout, world).positions(rank).to(x.device)
    return x.index_select(dim, idx)


def unshard(x_local: torch.Tensor, layout: str = "zigzag", *, group=None, dim: int = -2):
    """The whole tensor on every rank, from each rank's part in `layout` order (no autograd)."""
    check_layout(layout)
    world = comm.rank_world(group)[1]
    if world == 1:
        return x_local
    x = x_local.detach().movedim(dim, 0).contiguous()  # (n, ...)
    sizes = torch.zeros(world, dtype=torch.int64, device=x.device)
    comm.all_gather(sizes, torch.tensor([x.shape[0]], device=x.device), group, "unshard")
    n = int(sizes.sum())
    sh = Sharding(n, layout, world)
    want = [sh.size(r) for r in range(world)]
    if sizes.tolist() != want:
        raise AttnlabError(f"x_local: ranks hold {sizes.tolist()} rows along dim {dim}; layout "
                           f"{layout!r} with {n} rows over {world} ranks gives {want}")
    part = torch.cat([x, x.new_zeros(sh.n_max - x.shape[0], *x.shape[1:])])  # (n_max, ...)
    out = part.new_empty(world * sh.n_max, *x.shape[1:])
    comm.all_gather(out.view(-1), part.view(-1), group, "unshard")  # (P·n_max, ...)
    whole = out.index_select(0, sh.owner_order().to(x.device))  # (n, ...) in global order
    return whole.movedim(0, dim)


@dataclass(frozen=True)
class ContextParallel:
    """What a model is handed: a group and a layout. It never imports torch.distributed.

        >>> cp = attnlab.distributed.init(layout="zigzag")        # doctest: +SKIP
        >>> q_local = cp.shard(q)                                  # (B, H, L_local, D)
        >>> out = cp.attention(q_local, k_local, v_local, is_causal=True)
    """

    group: object = None
    layout: str = "zigzag"
    strategy: str = "auto"
    ulysses_size: int | None = None  # U of strategy "hybrid" (and of "auto"'s choices)
    calibration: object = None  # a Calibration: what "auto" plans with

    @property
    def rank(self) -> int:
        return comm.rank_world(self.group)[0]

    @property
    def world(self) -> int:
        return comm.rank_world(self.group)[1]

    def attention(self, query, key, value, **kwargs):
        kwargs.setdefault("strategy", self.strategy)
        if kwargs["strategy"] in ("hybrid", "auto"):  # the handle's U, where a strategy uses it
            kwargs.setdefault("ulysses_size", self.ulysses_size)
        kwargs.setdefault("calibration", self.calibration)
        return context_parallel_attention(query, key, value, group=self.group,
                                          layout=self.layout, **kwargs)

    def shard(self, x, dim: int = -2):
        return shard(x, self.layout, group=self.group, dim=dim)

    def unshard(self, x_local, dim: int = -2):
        return unshard(x_local, self.layout, group=self.group, dim=dim)

    def positions(self, L: int) -> torch.Tensor:
        return Sharding(L, self.layout, self.world).positions(self.rank)


def init(backend: str | None = None, *, layout: str = "zigzag", strategy: str = "auto",
         timeout_s: float = 300.0) -> ContextParallel:
    """Join the default process group (as `torchrun` sets it up: RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT) with a timeout, and return the handle for model code.

    backend: "gloo" (CPU) or "nccl" (GPU); default: nccl when CUDA is available.
    """
    check_layout(layout)
    check_choice("strategy", strategy, STRATEGY_CHOICES)
    if not comm.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        comm.init_group(backend, timeout_s=timeout_s)
    return ContextParallel(None, layout, strategy)
