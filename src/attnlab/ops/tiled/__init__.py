"""Backend "tiled": memory-efficient online-softmax attention that skips masked-out tiles.

    plan.py      which key ranges ("chunks") each block of query rows visits; built once per call
    setup.py     one call's inputs in the kernels' layout (Setup), the dropout replay
    chunk.py     one chunk's mask and scores (through the one score pipeline, `ops.scores`)
    fwd.py       the forward: a short dispatcher over row blocks, and the pure PyTorch rows
    bwd.py       the backward, split the same way
    fused.py     the fused path of both: each chunk on PyTorch's CPU flash kernel (`ops.fused_cpu`)
    autograd.py  the autograd Function, the runner `forward(problem, need_lse)` and
                 `backward(problem, out, lse, dout, dlse)` from a given (global) out and lse

Glossary of the shape comments (the same letters everywhere in attnlab):

    B    batch (all leading batch dims flattened into one inside the kernel)
    H    query heads            Hkv  key/value heads (H = Hkv without GQA)
    L    query length           S    key/value length
    D    query/key head dim     Dv   value head dim
    G    query heads per key/value head, H / Hkv (grouped-query attention; 1 for MHA)
    N    B·Hkv: the batch of one batched matmul; grouped heads ride along the rows
    bq   query rows of one row block (at most plan.BLOCK_Q)
    ck   key columns of one chunk (a contiguous key range of the plan)
    G·bq the rows of one matmul: the G query heads of a key/value head, bq rows each

e.g. `s = (q @ kᵀ) · scale  # (N, G·bq, D) @ (N, D, ck) -> (N, G·bq, ck)`; `X|1` marks a dim
that may be 1 and broadcast.
"""

from attnlab.ops.tiled.autograd import TiledAttention, backward, forward
from attnlab.ops.tiled.plan import Plan, make_plan, plan_for

__all__ = ["Plan", "TiledAttention", "backward", "forward", "make_plan", "plan_for"]
