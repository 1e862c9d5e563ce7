"""Backend "tiled": memory-efficient online-softmax attention that skips masked-out tiles.

    plan.py    which key ranges ("chunks") each block of query rows visits; built once per call
    kernel.py  the kernel, read top to bottom: one call's Setup, a chunk's mask and scores (through
               the one score pipeline, `ops.scores`), the forward, the backward, the autograd
               Function, and the entry points `forward(problem, need_lse)` and
               `backward(problem, out, lse, dout, dlse)` from a given (global) out and lse;
               the glossary of the shape comments is at its top
    fused.py   the fused path's arithmetic: a row block's chunks on PyTorch's CPU flash kernel
               (`ops.fused_cpu`), merged through their lse

kernel.py imports the other two; fused.py imports neither (the kernel prepares each fused chunk's
inputs), so the package has no import circle.
"""

from attnlab.ops.tiled.kernel import TiledAttention, backward, forward
from attnlab.ops.tiled.plan import Plan, make_plan, plan_for

__all__ = ["Plan", "TiledAttention", "backward", "forward", "make_plan", "plan_for"]
