"""Backend "tiled": memory-efficient online-softmax attention that skips masked-out tiles.

    plan.py    which key ranges ("chunks") each block of query rows visits; built once per call
    setup.py   one call's Setup: the inputs in the kernel's layout (flattened sizes, masks in their
               tiled form, the plan, the dropout seed), built once per call
    chunk.py   one chunk's mask and scores (through the one score pipeline, `ops.scores`), as the
               forward and the backward both recompute them, and the fused path's chunk inputs
    kernel.py  the kernel, read top to bottom: the forward, the backward, the autograd Function,
               and the entry points `forward(problem, need_lse)` and
               `backward(problem, out, lse, dout, dlse)` from a given (global) out and lse;
               the glossary of the shape comments is at its top
    fused.py   the fused path's arithmetic: a row block's chunks on PyTorch's CPU flash kernel
               (`ops.fused_cpu`), merged through their lse

kernel.py imports setup, chunk and fused; chunk imports setup; setup and fused import neither
(the kernel prepares each fused chunk's inputs through chunk.py), so the package has no import
circle.
"""

from attnlab.ops.tiled.kernel import TiledAttention, backward, forward
from attnlab.ops.tiled.plan import Plan, make_plan, plan_for

__all__ = ["Plan", "TiledAttention", "backward", "forward", "make_plan", "plan_for"]
