"""What every rank runs in the spawned group: each case computes context-parallel attention on its
shard and compares out, lse, dq, dk, dv with single-process attnlab on the whole tensors, and
records what was communicated. Ranks return plain numbers; the tests assert on them."""

from __future__ import annotations

import datetime
import math

import torch

import attnlab
import attnlab.distributed as cp
from attnlab import masks
from attnlab.errors import AttnlabError
from distributed.harness import make_mask, rel, subgroups

from helpers import plain_attention

LAYOUTS = ("contiguous", "zigzag", "striped")
STRATEGIES = ("ring", "allgather", "ulysses")
MASKS = ("none", "causal", "sliding", "document", "padding", "prefix", "combo")


def heads(P: int, kind: str) -> tuple[int, int]:
    if kind == "mqa":
        return 4, 1
    if kind == "mha1":
        return 1, 1
    if kind == "mha":
        return 2 * P if P > 1 else 2, 2 * P if P > 1 else 2
    return 2 * P, P  # gqa, ulysses-compatible


def _fast(P: int, layout: str, mk: str) -> bool:
    """The cases the default run covers; the rest of the full matrix is marked slow."""
    if P == 4:
        return mk in ("causal", "sliding", "document", "padding") or layout == "zigzag"
    if P == 2:
        return mk in ("causal", "document")
    if P == 3:
        return layout != "contiguous" and mk in ("causal", "padding")
    return layout == "zigzag" and mk in ("causal", "padding")


def exact_cases() -> list[dict]:
    """Every world size 1-4 x layout x strategy x mask kind, plus GQA/MQA/MHA, D = 64, L < P,
    NaN in masked keys, a sliding-window halo at L = 4096, and fp32/bf16 against the FA rule."""
    cases = []

    def add(**c):
        c.setdefault("B", 2)
        c.setdefault("heads", "gqa")
        c.setdefault("D", 32)
        c.setdefault("dtype", "fp64")
        c.setdefault("nan", False)
        c.setdefault("slow", False)
        c.setdefault("scale", None)
        c.setdefault("warm", False)
        cases.append(c)

    for P in (1, 2, 3, 4):
        for layout in LAYOUTS:
            for strategy in STRATEGIES:
                for mk in MASKS:
                    add(P=P, layout=layout, strategy=strategy, mask=mk, L=29 if P != 4 else 37,
                        slow=not _fast(P, layout, mk))
    for P in (2, 4):
        for strategy in ("ring", "allgather"):
            add(P=P, layout="zigzag", strategy=strategy, mask="causal", L=21, B=1,
                heads="mqa", D=64)
            add(P=P, layout="contiguous", strategy=strategy, mask="sliding", L=18, B=1,
                heads="mha", D=64)
        add(P=P, layout="zigzag", strategy="ulysses", mask="document", L=21, B=1, heads="mha",
            D=64)
    for layout in LAYOUTS:  # L < P: ranks with nothing
        for strategy in STRATEGIES:
            add(P=4, layout=layout, strategy=strategy, mask="causal", L=3, B=1)
    for strategy in STRATEGIES:  # NaN in keys/values no query may attend
        add(P=4, layout="zigzag", strategy=strategy, mask="padding", L=26, nan=True)
    # a window of 64 at L = 4096 over 4 ranks: only halos move
    for strategy in ("ring", "allgather"):
        add(P=4, layout="contiguous", strategy=strategy, mask="sliding64", L=4096, B=1,
            heads="mha1", D=32)
    # documents inside shards: ranks that share no document exchange nothing
    for layout in ("contiguous", "zigzag"):
        for strategy in ("ring", "allgather"):
            add(P=4, layout=layout, strategy=strategy, mask="docshard", L=37,
                slow=layout == "zigzag")
    # striped windows and & | ~ masks where tiles are several positions wide (PARTIAL tiles
    # refined by the mask): exact end to end; L = 300 in the default run, 257 and 512 slow
    for L in (257, 300, 512):
        for P in (2, 3):
            for mk in ("sliding", "combo", "window_or_prefix", "not_window", "window_and_doc"):
                for strategy in ("ring", "allgather"):
                    lay = "striped" if mk in ("sliding", "combo") or P == 2 else "zigzag"
                    add(P=P, layout=lay, strategy=strategy, mask=mk, L=L, B=1, heads="mha1",
                        D=16, slow=L != 300)
    # the band masks and function masks on the pair loop (fp64 never runs the interval kernel),
    # blocks starting past position 0; "warm": rank 0 used the mask once on its own before
    for mk in ("window", "block_causal", "block_diagonal", "ragged_causal", "function"):
        for layout in ("zigzag", "contiguous"):
            for strategy in ("ring", "allgather"):
                add(P=2, layout=layout, strategy=strategy, mask=mk, L=29)
    add(P=2, layout="zigzag", strategy="ring", mask="function_bh", L=29, heads="mha")
    add(P=3, layout="striped", strategy="allgather", mask="function", L=29)
    add(P=2, layout="zigzag", strategy="ring", mask="block_causal", L=29, warm=True)
    add(P=2, layout="zigzag", strategy="ring", mask="function", L=29, warm=True)
    for scale in (-0.5, 0.0):  # PyTorch's fused causal kernel is NaN for these alone
        for strategy in STRATEGIES:
            add(P=2, layout="zigzag", strategy=strategy, mask="causal", L=29, scale=scale)
    for dtype in ("fp32", "bf16"):
        for strategy in STRATEGIES:
            add(P=4, layout="zigzag", strategy=strategy, mask="causal", L=64, B=1, dtype=dtype)
    for i, c in enumerate(cases):
        c["id"] = (f"P{c['P']}-{c['layout']}-{c['strategy']}-{c['mask']}-L{c['L']}-"
                   f"{c['heads']}-D{c['D']}-{c['dtype']}" + ("-nan" if c["nan"] else "")
                   + ("" if c["scale"] is None else f"-scale{c['scale']:g}")
                   + ("-warm" if c["warm"] else ""))
        c["seed"] = i
    return cases


DT = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16}


def _abs_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    d = (x.detach().double() - ref.detach().double()).abs()
    return float(torch.nan_to_num(d, nan=float("inf")).max()) if d.numel() else 0.0


def run_case(c: dict, group, rank: int) -> dict:
    P, L, B, D = c["P"], c["L"], c["B"], c["D"]
    H, Hkv = heads(P, c["heads"])
    dtype = DT[c["dtype"]]
    g = torch.Generator().manual_seed(c["seed"])
    q64 = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    k64 = torch.randn(B, Hkv, L, D, generator=g, dtype=torch.float64)
    v64 = torch.randn(B, Hkv, L, D, generator=g, dtype=torch.float64)
    w = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)  # d loss / d out
    u = torch.randn(B, H, L, generator=g, dtype=torch.float64)  # d loss / d lse
    mask, is_causal = make_mask(c["mask"], L, B)
    if c["nan"]:  # keys and values past each batch element's key length
        dead = ~mask.to_dense(L, L).any(-2)[:, :, :, None]  # (B, 1, S, 1)
        k64 = k64.masked_fill(dead, float("nan"))
        v64 = v64.masked_fill(dead, float("nan"))
    kw = dict(mask=mask, is_causal=is_causal, enable_gqa=Hkv != H, scale=c["scale"])
    lay = c["layout"]
    if c["warm"] and rank == 0:  # the mask used once on this rank alone (its caches filled)
        attnlab.attention(q64, k64, v64, mask=mask, enable_gqa=Hkv != H)
    # ulysses: attnlab.attention's lse carries no gradient; the plain implementation has no lse
    big = L > 256  # the math backend's L×S buffers would be large: use the default one, no lse
    use_lse = c["strategy"] != "ulysses" and dtype == torch.float64 and not big

    def loss(out, lse, w_, u_):
        if not use_lse:
            return (out.double() * w_).sum()
        lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        return (out.double() * w_).sum() + (lse.double() * u_).sum()

    # single process, whole tensors (the math backend: its lse carries a gradient too)
    q, k, v = (x.to(dtype).requires_grad_() for x in (q64, k64, v64))
    ro, rl = attnlab.attention(q, k, v, return_lse=True, backend="auto" if big else "math", **kw)
    rg = torch.autograd.grad(loss(ro, rl, w, u), (q, k, v))
    # across processes
    ql, kl, vl = (cp.shard(x.detach(), lay, group=group).requires_grad_() for x in (q, k, v))
    with cp.record() as log:
        o, lse = cp.context_parallel_attention(ql, kl, vl, group=group, layout=lay,
                                               strategy=c["strategy"], return_lse=True, **kw)
        grads = torch.autograd.grad(loss(o, lse, cp.shard(w, lay, group=group),
                                         cp.shard(u, lay, group=group, dim=-1)), (ql, kl, vl))
    res = {"rows": ql.shape[2]}
    sh = [cp.shard(x, lay, group=group, dim=-1 if x.dim() == 3 else -2) for x in (ro, rl, *rg)]
    for name, a, b, full in zip(("out", "lse", "dq", "dk", "dv"), (o, lse, *grads), sh,
                                (ro, rl, *rg)):
        res[name] = rel(a, b, full)
    if dtype != torch.float64:  # FlashAttention's rule against the float64 oracle
        q64r, k64r, v64r = (x.clone().requires_grad_() for x in (q64, k64, v64))
        oo = attnlab.attention(q64r, k64r, v64r, backend="math", **kw)
        og = torch.autograd.grad(loss(oo, None, w, None), (q64r, k64r, v64r))
        m = cp.cost.effective_mask(mask, is_causal)
        allowed = None if m is None else m.to_dense(L, L)
        qp, kp, vp = (x.detach().requires_grad_() for x in (q, k, v))
        po = plain_attention(qp, kp, vp, allowed=allowed)
        pg = torch.autograd.grad(loss(po, None, w, None), (qp, kp, vp))
        for name, a, plain, ref in zip(("out", "dq", "dk", "dv"), (o, *grads), (po, *pg),
                                       (oo, *og)):
            res[f"err_{name}"] = _abs_err(a, cp.shard(ref, lay, group=group))
            res[f"plain_{name}"] = _abs_err(cp.shard(plain, lay, group=group),
                                            cp.shard(ref, lay, group=group))
    res["fwd_sent"] = log.total("forward", "sent")
    res["fwd_recv"] = log.total("forward", "received")
    res["bwd_sent"] = log.total("backward", "sent")
    res["bwd_recv"] = log.total("backward", "received")
    res["pairs"] = len(log.pairs)
    res["fwd_sends"] = log.count("send", "forward")
    res["msgs"] = tuple(log.messages(ph, what) for ph in ("forward", "backward")
                        for what in ("sent", "received"))
    res["fwd_from"] = log.bytes_by_peer("forward", "received")
    res["fwd_to"] = log.bytes_by_peer("forward", "sent")
    res["row_bytes"] = B * Hkv * 2 * D * torch.empty((), dtype=dtype).element_size()
    res["rows_attendable"] = _rows_attendable(L, P, lay, rank, mask, is_causal)
    res["finite"] = bool(torch.isfinite(o).all()) and all(bool(torch.isfinite(x).all())
                                                          for x in grads)
    est = cp.plan(L, H, Hkv, D, P, mask=mask, is_causal=is_causal, layout=lay, dtype=dtype,
                  batch=B)[c["strategy"]]
    res["plan"] = (est.fwd_sent[rank], est.fwd_recv[rank], est.bwd_sent[rank],
                   est.bwd_recv[rank])
    res["plan_msgs"] = (est.fwd_msgs_sent[rank], est.fwd_msgs_recv[rank],
                        est.bwd_msgs_sent[rank], est.bwd_msgs_recv[rank])
    res["expected_pairs"] = _expected_pairs(c, L, P, rank, mask, is_causal)
    return res


def _expected_pairs(c, L, P, rank, mask, is_causal) -> int | None:
    """Block pairs with anything to attend, from the dense mask (ring: one pair per (local
    piece, piece of the keys received from a rank), its own keys included)."""
    if c["strategy"] != "ring":
        return None
    m = cp.cost.effective_mask(mask, is_causal)
    dense = None if m is None else m.to_dense(L, L).flatten(0, 1).any(0)  # (L, S)
    geom = cp.geometry.Geometry(L, L, P, c["layout"], m)
    n = 0
    for src in range(P):
        kps = geom.k.pieces(rank) if src == rank else geom.received_pieces(rank, src)
        for qp in geom.q.pieces(rank):
            for kp in kps:
                if dense is None or bool(dense[qp.positions][:, kp.positions].any()):
                    n += 1
    return n


def _rows_attendable(L, P, layout, rank, mask, is_causal) -> int:
    """How many keys of the other ranks some query of this rank may attend (the dense mask): the
    least a rank can receive."""
    from attnlab.distributed.layouts import Sharding

    m = cp.cost.effective_mask(mask, is_causal)
    sh = Sharding(L, layout, P)
    mine, others = sh.positions(rank), torch.ones(L, dtype=torch.bool)
    others[mine] = False
    if not len(mine):
        return 0
    if m is None:
        return int(others.sum())
    seen = m.to_dense(L, L).flatten(0, 1).any(0)[mine].any(0)  # (S,)
    return int((seen & others).sum())


def run_exact(rank: int, world: int, slow: bool) -> dict:
    """Every case of the fast (or the slow) set that includes this rank; then the error calls."""
    groups = subgroups(world)
    out = {}
    for c in exact_cases():
        if rank < c["P"] and c["slow"] == slow:
            out[c["id"]] = run_case(c, groups[c["P"]], rank)
    if not slow:
        out["_errors"] = run_error_cases(rank, world, groups)
    return out


def _catch(fn) -> str:
    try:
        fn()
    except AttnlabError as e:
        return f"AttnlabError: {e}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def run_error_cases(rank: int, world: int, groups) -> dict:
    """Calls that must fail alike on every rank, without hanging."""
    g = groups[world]
    L, res = 16, {}
    gen = torch.Generator().manual_seed(7)  # the same tensors on every rank
    x = torch.randn(1, 4, L, 8, dtype=torch.float64, generator=gen)
    xs = cp.shard(x, "zigzag", group=g)

    def call(**kw):
        args = dict(group=g, layout="zigzag", strategy="ring")
        args.update(kw)
        return lambda: cp.context_parallel_attention(xs, xs, xs, **args)

    res["causal_mismatch"] = _catch(call(is_causal=rank == 2))
    res["layout_mismatch"] = _catch(call(layout="zigzag" if rank else "contiguous"))
    res["scale_mismatch"] = _catch(call(scale=0.5 if rank == 1 else None))
    doc = torch.tensor([0] * 8 + [1] * 8) if rank != 3 else torch.tensor([0] * 9 + [1] * 7)
    res["mask_mismatch"] = _catch(call(mask=masks.document(doc)))
    width = 6 if rank == 3 else 5  # function masks compare by what they do, not their repr
    res["function_mismatch"] = _catch(call(mask=masks.from_function(
        lambda b, h, q, k: (q - k >= 0) & (q - k < width))))

    def fails_on_rank_2(b, h, q, k):
        if rank == 2:
            raise ValueError("rank 2's function fails")
        return q >= k

    res["function_raises"] = _catch(call(mask=masks.from_function(fails_on_rank_2)))
    bad = xs[..., :4] if rank == 1 else xs  # one rank's bad input: every rank raises
    res["one_bad_rank"] = _catch(
        lambda: cp.context_parallel_attention(xs, bad, xs, group=g, strategy="ring"))
    n = 5 if rank == 0 else 4  # L = 17: zigzag over 4 gives rank 0 six rows
    res["wrong_rows"] = _catch(
        lambda: cp.context_parallel_attention(x[:, :, :n], x[:, :, :n], x[:, :, :n], group=g))
    y = torch.randn(1, 6, L, 8, dtype=torch.float64, generator=gen)
    ys = cp.shard(y, "zigzag", group=g)
    res["ulysses_heads"] = _catch(
        lambda: cp.context_parallel_attention(ys, ys, ys, group=g, strategy="ulysses"))
    kv = ys[:, :2]  # GQA, Hkv = 2 < P: replication covers the key/value heads, not H = 6
    res["ulysses_gqa_heads"] = _catch(lambda: cp.context_parallel_attention(
        ys, kv, kv, group=g, strategy="ulysses", enable_gqa=True))
    # rank 3 shards a sequence of 15, the others one of 16: the sizes happen to fit a layout of
    # 15 rows ([4, 4, 4, 3]); only seq_len tells
    z = x if rank != 3 else x[:, :, :15]
    zs = cp.shard(z, "contiguous", group=g)
    res["mixed_lengths_unchecked"] = _catch(lambda: cp.context_parallel_attention(
        zs, zs, zs, group=g, layout="contiguous", strategy="ring"))
    res["seq_len_sum"] = _catch(lambda: cp.context_parallel_attention(
        zs, zs, zs, group=g, layout="contiguous", strategy="ring", seq_len=16))
    res["seq_len_differs"] = _catch(call(seq_len=17 if rank == 3 else 16))
    res["seq_len_bad"] = _catch(call(seq_len=(16, 0)))
    res["seq_len_ok"] = _catch(call(seq_len=(16, 16)))
    # the group still works after all of that
    o = cp.context_parallel_attention(xs, xs, xs, group=g, is_causal=True)
    ref = cp.shard(attnlab.attention(x, x, x, is_causal=True), "zigzag", group=g)
    res["after_errors"] = rel(o, ref, ref)
    # unshard gives the whole tensor back
    res["unshard"] = rel(cp.unshard(xs, "zigzag", group=g), x, 1.0)
    res["unshard_striped"] = rel(cp.unshard(cp.shard(x, "striped", group=g, dim=2), "striped",
                                             group=g, dim=2), x, 1.0)
    # a rank that never makes the call: the others fail by the group's timeout, not hang
    import torch.distributed as dist

    short = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=3))
    if rank == 0:
        res["missing_peer"] = _catch(call(group=short))
    else:
        res["missing_peer"] = "skipped the call"
    res["pi"] = math.pi  # a marker that the worker got to the end
    return res
