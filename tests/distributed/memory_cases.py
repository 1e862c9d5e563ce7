"""What the memory tests run on every rank: a causal ring call's live tensor bytes (TensorLedger)
against one process's, and its gradients against one process's in float64 with the head-by-head
backward forced."""

from __future__ import annotations

import torch


def _whole(L, H, Hkv, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, h, L, D, generator=g, dtype=dtype) for h in (H, Hkv, Hkv)]


def ring_peak(rank: int, world: int, L: int, H: int, D: int, head_split: int | None = None
              ) -> dict:
    """{"single": one process's peak bytes (rank 0 only), "ring": this rank's} of a causal
    forward + backward, fp32, each after a warm-up call; head_split: the ring's
    `attend.HEAD_SPLIT_ELEMENTS` (None: as shipped)."""
    import attnlab
    import attnlab.distributed as cp
    from attnlab.distributed import attend
    from attnlab.distributed.ledger import TensorLedger

    if head_split is not None:
        attend.HEAD_SPLIT_ELEMENTS = head_split

    out = {}
    whole = _whole(L, H, H, D, torch.float32)
    if rank == 0:
        q, k, v = (x.clone().requires_grad_() for x in whole)
        for _ in range(2):
            with TensorLedger() as ledger:
                attnlab.attention(q, k, v, is_causal=True).sum().backward()
            q.grad = k.grad = v.grad = None
        out["single"] = ledger.peak
    q, k, v = (cp.shard(x).requires_grad_() for x in whole)
    del whole
    for _ in range(2):
        with TensorLedger() as ledger:
            cp.context_parallel_attention(q, k, v, strategy="ring",
                                          is_causal=True).sum().backward()
        q.grad = k.grad = v.grad = None
    out["ring"] = ledger.peak
    out["shard"] = q.numel() * q.element_size()
    return out


def split_heads_exact(rank: int, world: int) -> dict:
    """{(mask, strategy): worst relative error of out, dq, dk, dv} against one process in
    float64, with every backward block run head by head (GQA: H = 4, Hkv = 2)."""
    import attnlab
    import attnlab.distributed as cp
    from attnlab import masks
    from attnlab.distributed import attend

    attend.HEAD_SPLIT_ELEMENTS = 0  # every block splits
    L = 96
    res = {}
    for name, m in (("causal", masks.causal()), ("window", masks.sliding_window(17)),
                    ("document", masks.document(torch.arange(L) // 40))):
        whole = [x.requires_grad_() for x in _whole(L, 4, 2, 8, torch.float64, seed=1)]
        ref = attnlab.attention(*whole, mask=m, enable_gqa=True, backend="math")
        ref_g = torch.autograd.grad((ref * ref).sum(), whole)
        for strategy in ("ring", "allgather"):
            part = [cp.shard(x.detach()).requires_grad_() for x in whole]
            o = cp.context_parallel_attention(*part, mask=m, enable_gqa=True, strategy=strategy)
            g = torch.autograd.grad((o * o).sum(), part)
            errs = [_rel(o, cp.shard(ref.detach()))]
            errs += [_rel(a, cp.shard(b)) for a, b in zip(g, ref_g)]
            res[(name, strategy)] = max(errs)
    return res


def _rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))
