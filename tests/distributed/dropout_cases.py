"""Run on each rank of a spawned gloo group: context-parallel attention with keyed dropout for
P = 1-4 × layouts × strategies against a dense float64 oracle that applies the same keyed mask,
and a GPT with attention dropout under P = 1, 2, 4 context-parallel ranks."""

from __future__ import annotations

import math

import torch

import attnlab.distributed as cp
from attnlab import AttnlabError
from attnlab.distributed import keyed
from distributed import harness
from distributed.harness import rel, subgroups

P_DROP, SEED, L, B, D = 0.3, 20261130, 23, 2, 8

#: name -> (H, Hkv, mask kind, softcap, NaN in keys no row attends)
CONFIGS = {
    "mha-causal": (12, 12, "causal", None, False),
    "mha-none": (12, 12, "none", None, False),
    "mha-window": (12, 12, "window", None, False),
    "mha-padding-nan": (12, 12, "padding", None, True),
    "gqa-causal-softcap": (4, 2, "causal", 3.0, False),
}
LAYOUTS = ("contiguous", "zigzag", "striped")
STRATEGIES = ("ring", "allgather", "ulysses")


def make_mask(kind: str):
    """(mask, is_causal) on global positions, at this module's L."""
    return harness.make_mask({"window": "sliding"}.get(kind, kind), L)


def oracle(q, k, v, allowed, softcap, seed=SEED, p=P_DROP):
    """Dense float64 attention with the keyed mask of every (b, h, i, j): (out, lse)."""
    H, Hkv = q.shape[1], k.shape[1]
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)  # -> (B, H, S, D)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, L, D) @ (B, H, D, S)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)  # (B, H, L)
    w = torch.exp(s - torch.where(torch.isinf(lse), math.inf, lse)[..., None])
    keep = keyed.keep_mask(seed, p, q.shape[0], torch.arange(H), torch.arange(q.shape[2]),
                           torch.arange(k.shape[2]))
    return (w * keep / (1 - p)) @ v, lse  # (B, H, L, S) @ (B, H, S, Dv) -> (B, H, L, Dv)


def _inputs(name):
    H, Hkv, kind, softcap, nan = CONFIGS[name]
    g = torch.Generator().manual_seed(len(name))
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, L, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, L, D, generator=g, dtype=torch.float64)
    w = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)  # d loss / d out
    u = torch.randn(B, H, L, generator=g, dtype=torch.float64)  # d loss / d lse
    mask, is_causal = make_mask(kind)
    m = cp.cost.effective_mask(mask, is_causal)
    allowed = None if m is None else m.to_dense(L, L)  # (Bm, Hm, L, S)
    k_in, v_in = k, v
    if nan:  # keys no query may attend hold NaN; the oracle sees zeros there
        dead = ~allowed.any(-2)[:, :, :, None]  # (B, 1, S, 1)
        k_in, v_in = k.masked_fill(dead, math.nan), v.masked_fill(dead, math.nan)
    return (q, k, v, k_in, v_in, w, u, mask, is_causal, allowed, softcap)


def _loss(out, lse, w, u):
    return (out * w).sum() + (torch.where(torch.isinf(lse), 0.0, lse) * u).sum()


def run_exact(rank: int, world: int) -> dict:
    """{(config, P, layout, strategy): {out, lse, dq, dk, dv: relative error vs the oracle}} of
    this rank (None where the strategy cannot run)."""
    groups = subgroups(world)
    res = {}
    for name in CONFIGS:
        q, k, v, k_in, v_in, w, u, mask, is_causal, allowed, softcap = _inputs(name)
        qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
        ro, rl = oracle(qr, kr, vr, allowed, softcap)
        ref = (ro, rl, *torch.autograd.grad(_loss(ro, rl, w, u), (qr, kr, vr)))
        for P in range(1, world + 1):
            if rank >= P:
                continue
            grp = groups[P]
            for lay in LAYOUTS:
                def sh(x, dim=-2, lay=lay, grp=grp):
                    return cp.shard(x, lay, group=grp, dim=dim)

                for strat in STRATEGIES:
                    ql, kl, vl = (sh(x).requires_grad_() for x in (q, k_in, v_in))
                    try:
                        o, lse = cp.context_parallel_attention(
                            ql, kl, vl, group=grp, layout=lay, strategy=strat, mask=mask,
                            is_causal=is_causal, softcap=softcap, enable_gqa=True,
                            return_lse=True, dropout_p=P_DROP, dropout_seed=SEED)
                    except AttnlabError as e:  # ulysses: heads that do not split over P
                        assert "strategy" in str(e), e
                        res[(name, P, lay, strat)] = None
                        continue
                    got = (o, lse, *torch.autograd.grad(_loss(o, lse, sh(w), sh(u, -1)),
                                                        (ql, kl, vl)))
                    res[(name, P, lay, strat)] = {
                        what: rel(a, sh(b, -1 if what == "lse" else -2))
                        for what, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, ref)}
    return res


def p_zero_is_the_old_path(rank: int, world: int) -> dict:
    """Per strategy: out and grads with dropout_p=0 (and a seed) bit-equal to the call without
    dropout arguments; and whether p = 0 left torch's random stream alone."""
    q, k, v = _inputs("gqa-causal-softcap")[:3]
    res = {}
    for strat in ("ring", "allgather"):
        outs = []
        for kw in ({}, {"dropout_p": 0.0, "dropout_seed": 7}, {"dropout_p": 0}):
            ql, kl, vl = (cp.shard(x).requires_grad_() for x in (q, k, v))
            state = torch.get_rng_state()
            o = cp.context_parallel_attention(ql, kl, vl, strategy=strat, is_causal=True,
                                              enable_gqa=True, softcap=3.0, **kw)
            untouched = torch.equal(state, torch.get_rng_state())
            outs.append((o, *torch.autograd.grad(o.square().sum(), (ql, kl, vl)), untouched))
        res[strat] = all(all(torch.equal(a, b) for a, b in zip(outs[0][:4], x[:4])) and x[4]
                         for x in outs[1:])
    return res


def gpt_losses(rank: int, world: int) -> dict:
    """{P: (loss, flat gradient)} of a float64 GPT whose only dropout is attention dropout 0.2,
    trained one step under P context-parallel ranks with the trainer's per-step keys; plus the
    loss at another step and in eval mode (P = 1)."""
    import torch.distributed as dist

    from attnlab.distributed import ContextParallel
    from attnlab.models import GPT, GPTConfig
    from attnlab.models.parallel import Parallel
    groups = subgroups(world)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=23, block_size=40, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                    rotary=True, dropout=0.2)
    model = GPT(cfg).double()
    for mod in model.modules():  # the residual and MLP dropouts draw from each rank's stream
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 23, (2, 29), generator=g)
    y = torch.randint(0, 23, (2, 29), generator=g)
    out = {}
    for P in (1, 2, world):
        if rank >= P:
            continue
        handle = ContextParallel(groups[P], layout="zigzag")
        par = Parallel(rank, P, 1, P, handle, torch.device("cpu"), 30.0)
        model.set_context_parallel(handle).train()
        model.zero_grad(set_to_none=True)
        par.key_dropout(model, 1337, 5)
        _, share = model(x, y)
        share.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        total = torch.cat([share.detach().reshape(1), flat])
        dist.all_reduce(total, group=groups[P])  # (1 + n,): the loss and gradient of the batch
        out[P] = (total[0].item(), total[1:])
        if P == 1:
            with torch.no_grad():
                par.key_dropout(model, 1337, 6)
                out["step6"] = model(x, y)[1].item()
                out["eval"] = model.eval()(x, y)[1].item()
    model.set_context_parallel(None)
    return out


def all_cases(rank: int, world: int) -> dict:
    """Every case above on one spawned group (spawning costs seconds)."""
    return {"exact": run_exact(rank, world), "p0": p_zero_is_the_old_path(rank, world),
            "gpt": gpt_losses(rank, world)}
