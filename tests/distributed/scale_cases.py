"""What every rank runs for the scale tests (Ulysses head flexibility, hybrid Ulysses × ring,
packed sequences): each case computes context-parallel attention on its shard with a loss of the
output and the lse, compares out, lse, dq, dk, dv in float64 with single-process attnlab on the
whole tensors, and returns the bytes and messages it counted beside the plan's. Ranks return
plain numbers; the tests assert on them."""

from __future__ import annotations

import torch

import attnlab
import attnlab.distributed as cp
from attnlab.errors import AttnlabError
from distributed.harness import make_mask, rel, run_each, subgroups

GROUP_TIMEOUT_S = 20.0


def head_cases() -> list[dict]:
    """Ulysses with K/V heads replicated (P a multiple of Hkv, MQA, lcm(Hkv, P) copies)."""
    out = []
    for P, H, Hkv, layout, mk in ((4, 8, 2, "zigzag", "causal"), (4, 4, 1, "contiguous", "sliding"),
                                  (4, 12, 3, "striped", "document"), (2, 6, 3, "zigzag", "none"),
                                  (3, 6, 2, "zigzag", "padding")):
        out.append(dict(kind="heads", P=P, H=H, Hkv=Hkv, layout=layout, mask=mk, L=29,
                        strategy="ulysses", U=None))
    return out


def hybrid_cases() -> list[dict]:
    """strategy="hybrid": all-to-all over heads in groups of U ranks, ring across groups."""
    out = []
    for P, U, H, Hkv, layout, mk, L in ((4, 2, 4, 2, "zigzag", "causal", 37),
                                        (4, 2, 4, 4, "contiguous", "sliding", 29),
                                        (4, 2, 4, 1, "striped", "document", 29),
                                        (4, 2, 6, 3, "zigzag", "none", 21),
                                        (4, 4, 4, 2, "zigzag", "causal", 21),
                                        (2, 2, 2, 1, "contiguous", "prefix", 17)):
        out.append(dict(kind="hybrid", P=P, U=U, H=H, Hkv=Hkv, layout=layout, mask=mk, L=L,
                        strategy="hybrid"))
    return out


def varlen_cases() -> list[dict]:
    """Packed documents (cu_seqlens), each split head and tail over the ranks."""
    out = []
    for P, cu, strategy, causal, H, Hkv in (
            (2, (0, 7, 20, 29), "ring", True, 2, 1),
            (4, (0, 5, 18, 18, 37), "ring", True, 4, 2),  # an empty document
            (4, (0, 5, 18, 18, 37), "allgather", True, 4, 2),
            (4, (0, 3, 40), "ulysses", True, 4, 2),
            (3, (0, 11, 12, 29), "ring", False, 3, 3),  # within documents, no causal
            (4, (0, 37), "allgather", True, 4, 4)):  # one document: every rank needs all
        out.append(dict(kind="varlen", P=P, cu=cu, strategy=strategy, causal=causal, H=H,
                        Hkv=Hkv, L=cu[-1], U=None, layout="documents",
                        mask=("causal-" if causal else "") + "docs" + "-".join(map(str, cu))))
    return out


def all_cases() -> list[dict]:
    cases = head_cases() + hybrid_cases() + varlen_cases()
    for i, c in enumerate(cases):
        c["seed"] = 4000 + i
        c["id"] = (f"{c['kind']}-P{c['P']}" + (f"U{c['U']}" if c["U"] else "")
                   + f"-{c['layout']}-{c['mask']}-L{c['L']}-H{c['H']}kv{c['Hkv']}"
                   + (f"-{c['strategy']}" if c["kind"] == "varlen" else ""))
    return cases


def run_case(c: dict, group, rank: int) -> dict:
    L, H, Hkv, D, B, P = c["L"], c["H"], c["Hkv"], 16, 2, c["P"]
    g = torch.Generator().manual_seed(c["seed"])
    q, k, v = (torch.randn(B, h, L, D, generator=g, dtype=torch.float64) for h in (H, Hkv, Hkv))
    w = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)  # d loss / d out
    u = torch.randn(B, H, L, generator=g, dtype=torch.float64)  # d loss / d lse
    lay = c["layout"]
    if c["kind"] == "varlen":
        from attnlab import masks
        from attnlab.distributed.varlen import DocumentSharding

        mask = masks.document(DocumentSharding(c["cu"], 1).doc_of)
        is_causal = c["causal"]
    else:
        mask, is_causal = make_mask(c["mask"], L, B)
    kw = dict(mask=mask, is_causal=is_causal, enable_gqa=Hkv != H)
    whole = [x.clone().requires_grad_() for x in (q, k, v)]
    ro, rl = attnlab.attention(*whole, return_lse=True, backend="math", **kw)
    fin = torch.isfinite(rl)
    rg = torch.autograd.grad([ro, rl], whole, [w, u.masked_fill(~fin, 0.0)])
    sh = lambda x, dim=-2: cp.shard(x, lay, group=group, dim=dim)  # noqa: E731
    if c["kind"] == "varlen":
        sh = lambda x, dim=-2: cp.varlen_shard(x, c["cu"], group=group, dim=dim)  # noqa: E731
    local = [sh(x).requires_grad_() for x in (q, k, v)]
    extra = {"ulysses_size": c["U"]} if c["strategy"] == "hybrid" else {}
    with cp.record() as log:
        if c["kind"] == "varlen":
            o, lse = cp.varlen_attention(*local, c["cu"], group=group, strategy=c["strategy"],
                                         causal=is_causal, return_lse=True,
                                         enable_gqa=Hkv != H)
        else:
            o, lse = cp.context_parallel_attention(*local, group=group, layout=lay,
                                                   strategy=c["strategy"], return_lse=True,
                                                   **extra, **kw)
        ul = sh(u, -1).masked_fill(~torch.isfinite(lse), 0.0)
        grads = torch.autograd.grad([o, lse], local, [sh(w), ul])
    out = {"rows": o.shape[2]}
    for name, a, full in (("out", o, ro), ("lse", lse, rl), ("dq", grads[0], rg[0]),
                          ("dk", grads[1], rg[1]), ("dv", grads[2], rg[2])):
        out[name] = rel(a, sh(full, -1 if full.dim() == 3 else -2), full)
    out["got"] = tuple(f(ph, what) for f in (log.total, log.messages)
                       for ph in ("forward", "backward") for what in ("sent", "received"))
    if c["kind"] == "varlen":
        est = cp.varlen_plan(c["cu"], H, Hkv, D, P, causal=is_causal, dtype=torch.float64,
                             batch=B)[c["strategy"]]
        out["unshard"] = rel(cp.varlen_unshard(o, c["cu"], group=group), ro)
        # the fewest bytes a rank can receive forward: the other ranks' keys its queries may
        # attend (the dense mask), k and v, B·Hkv·2D·8 bytes a key
        m = cp.cost.effective_mask(mask, is_causal).to_dense(L, L)[0, 0]  # (L, S)
        from attnlab.distributed.varlen import DocumentSharding

        pos = DocumentSharding(c["cu"], P).positions(rank)
        others = torch.ones(L, dtype=torch.bool)
        others[pos] = False
        seen = m[pos].any(0) & others if len(pos) else torch.zeros(L, dtype=torch.bool)
        out["attendable_bytes"] = int(seen.sum()) * B * Hkv * 2 * D * 8
    else:
        est = cp.plan(L, H, Hkv, D, P, mask=mask, is_causal=is_causal, layout=lay,
                      dtype=torch.float64, batch=B, **extra)[c["strategy"]]
    out["plan"] = (est.fwd_sent[rank], est.fwd_recv[rank], est.bwd_sent[rank],
                   est.bwd_recv[rank], est.fwd_msgs_sent[rank], est.fwd_msgs_recv[rank],
                   est.bwd_msgs_sent[rank], est.bwd_msgs_recv[rank])
    return out


def _catch(fn) -> str:
    try:
        fn()
    except AttnlabError as e:
        return f"AttnlabError: {e}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def error_cases(rank: int, groups) -> dict:
    """Calls that must fail alike on every rank of the group of 4, without hanging."""
    g = groups[4]
    x = cp.shard(torch.randn(1, 6, 16, 8, dtype=torch.float64,
                             generator=torch.Generator().manual_seed(1)), group=g)
    call = lambda **kw: (lambda: cp.context_parallel_attention(x, x, x, group=g, **kw))  # noqa
    return {"uneven_heads": _catch(call(strategy="ulysses")),
            "hybrid_no_size": _catch(call(strategy="hybrid")),
            "hybrid_bad_size": _catch(call(strategy="hybrid", ulysses_size=3)),
            "hybrid_uneven_heads": _catch(call(strategy="hybrid", ulysses_size=4))}


def calibration_cases(rank: int, groups) -> dict:
    """calibrate on the group of 4 (one tier; two tiers of 2 x 2) and on a sub-group of 2, with
    small messages and a small block (the test is for what it returns, not for the numbers),
    and "auto" planning a call on a calibration: what it sends is the plan of its pick."""
    quick = dict(small=1024, large=1 << 16, repeats=2, block=(1, 64, 16))
    with cp.record() as log:
        one = cp.calibrate(groups[4], **quick)
    two = cp.calibrate(groups[4], ulysses_size=2, **quick)
    pair = cp.calibrate(groups[2], **quick) if rank < 2 else None
    bad = _catch(lambda: cp.calibrate(groups[4], ulysses_size=3, **quick))
    L, H, D = 64, 4, 16
    x = torch.randn(1, H, L, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    xs = cp.shard(x, group=groups[4])
    with cp.record() as run:
        cp.context_parallel_attention(xs, xs, xs, group=groups[4], is_causal=True,
                                      calibration=two, ulysses_size=2)
    p = cp.plan(L, H, H, D, 4, is_causal=True, dtype=torch.float64, calibration=two,
                ulysses_size=2)
    return {"one": one, "two": two, "pair": pair, "bad": bad, "phases": {o.phase for o in log.ops},
            "auto_sent": run.total("forward"), "choice": p.choice,
            "choice_sent": p[p.choice].fwd_sent[rank]}


def run_scale(rank: int, world: int) -> dict:
    """Every case that includes this rank; an error is returned, not raised, per case."""
    groups = subgroups(world, GROUP_TIMEOUT_S, smallest=2)
    out = run_each(all_cases(), lambda c, g: run_case(c, g, rank), groups, rank)
    out["_errors"] = error_cases(rank, groups)
    out["_calibration"] = calibration_cases(rank, groups)
    return out
