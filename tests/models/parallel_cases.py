"""Run on each rank of a spawned gloo group (see tests/distributed/launch.py): a GPT handed a
context-parallel handle against the same GPT in one process, in float64."""

from __future__ import annotations

import torch

from attnlab.distributed import ContextParallel
from attnlab.models import GPT, GPTConfig

CONFIGS = {
    "learned": {"rotary": False},
    "rotary-gqa": {"rotary": True, "n_kv_head": 2},
}


def loss_and_grads_match(rank: int, world: int, L: int) -> dict:
    """{config: (loss difference, largest gradient difference)} of the group's GPT against the
    one-process GPT on the same batch; every rank holds the whole batch."""
    import torch.distributed as dist

    out = {}
    for name, over in CONFIGS.items():
        torch.manual_seed(0)
        cfg = GPTConfig(vocab_size=23, block_size=40, n_layer=2, n_head=4, n_embd=32, **over)
        model = GPT(cfg).double()
        g = torch.Generator().manual_seed(1)
        x = torch.randint(0, 23, (2, L), generator=g)
        y = torch.randint(0, 23, (2, L), generator=g)
        _, ref = model(x, y)
        ref.backward()
        want = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        model.set_context_parallel(ContextParallel(None, layout="zigzag"))
        logits, share = model(x, y)
        share.backward()
        total = share.detach().clone()
        dist.all_reduce(total)  # (): each rank's share -> the loss of the whole sequence
        diff = 0.0
        for n, p in model.named_parameters():
            grad = p.grad.clone()
            dist.all_reduce(grad)  # a parameter's gradient: the sum of every rank's part
            diff = max(diff, (grad - want[n]).abs().max().item())
        out[name] = (abs(total.item() - ref.item()), diff, logits.shape[1])
    return out
