"""What every rank of the spawned group runs for the catalogue's strategy sweep: each catalogue
mask through `context_parallel_attention` with each strategy and layout (P = 2; hybrid on P = 4
with two Ulysses groups), float64, against one-process attnlab on the whole tensors: out, lse,
dq, dk, dv. The mask is passed as the user builds it (a function reading b or h included)."""

from __future__ import annotations

import traceback

import torch

import attnlab
import attnlab.distributed as cp
import catalog
from attnlab import AttnlabError
from distributed.harness import rel, subgroups

B, H, Hkv, D, L = 2, 4, 2, 8, 29


def cases() -> list[dict]:
    """A covering sample of mask × strategy × layout (every value at least once), then the
    rest of the product: {"id", "case", "strategy", "layout", "P", "slow"}."""
    axes = {"case": catalog.MASKS, "strategy": list(catalog.CP_STRATEGIES),
            "layout": list(catalog.CP_LAYOUTS)}
    quick = catalog.covering(axes, seed=4)
    seen = {catalog.case_id(d) for d in quick}
    out = []
    for d in quick + [d for d in catalog.product(axes) if catalog.case_id(d) not in seen]:
        out.append({"id": catalog.case_id(d), "case": d["case"].name, "strategy": d["strategy"],
                    "layout": d["layout"], "P": 4 if d["strategy"] == "hybrid" else 2,
                    "slow": catalog.case_id(d) not in seen})
    return out


def may_refuse(c: dict) -> bool:
    """Ulysses and hybrid split heads over ranks: a per-head mask is refused (AttnlabError) —
    one that is per head as the call binds it (a mask_mod that may read h counts)."""
    m = catalog.mask_case(c["case"]).build(B, H, L, L).for_call(B, H)
    return c["strategy"] in ("ulysses", "hybrid") and m.heads > 1


def run_case(c: dict, group, rank: int) -> dict:
    case = catalog.mask_case(c["case"])
    g = torch.Generator().manual_seed(11)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q, k, v = mk(B, H, L, D), mk(B, Hkv, L, D), mk(B, Hkv, L, D)
    w, u = mk(B, H, L, D), mk(B, H, L)
    mask = case.build(B, H, L, L)

    def loss(out, lse):
        lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        return (out * w_).sum() + (lse * u_).sum()

    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ro, rl = attnlab.attention(qr, kr, vr, mask=mask, enable_gqa=True, backend="math",
                               return_lse=True)
    w_, u_ = w, u
    rg = torch.autograd.grad(loss(ro, rl), (qr, kr, vr))
    lay = c["layout"]
    ql, kl, vl = (cp.shard(x, lay, group=group).requires_grad_() for x in (q, k, v))
    kw = {"ulysses_size": 2} if c["strategy"] == "hybrid" else {}
    o, lse = cp.context_parallel_attention(ql, kl, vl, group=group, layout=lay, mask=mask,
                                           strategy=c["strategy"], enable_gqa=True,
                                           return_lse=True, **kw)
    w_, u_ = cp.shard(w, lay, group=group), cp.shard(u, lay, group=group, dim=-1)
    grads = torch.autograd.grad(loss(o, lse), (ql, kl, vl))
    res = {}
    for name, a, full in zip(("out", "lse", "dq", "dk", "dv"), (o, lse, *grads),
                             (ro, rl, *rg)):
        res[name] = rel(a, cp.shard(full, lay, group=group, dim=-1 if full.dim() == 3 else -2),
                        full)
    return res


def run_catalog(rank: int, world: int, slow: bool) -> dict:
    """{case id: result or {"error": traceback}} of every case of the quick (or slow) set that
    includes this rank."""
    groups = subgroups(world, smallest=2)
    out = {}
    for c in cases():
        if c["slow"] == slow and rank < c["P"]:
            try:
                out[c["id"]] = run_case(c, groups[c["P"]], rank)
            except AttnlabError as e:  # a refusal: the test says whether it may refuse
                out[c["id"]] = {"refused": str(e)}
            except Exception:
                out[c["id"]] = {"error": traceback.format_exc(limit=4)}
    return out
