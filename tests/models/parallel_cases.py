"""Run on each rank of a spawned gloo group (see tests/distributed/harness.py): a GPT handed a
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


def nan_on_one_rank_stops_all(rank: int, world: int, out: str, cp: int) -> dict:
    """Train 2 steps (rank 0 saves), then let rank `world - 1` alone produce a NaN loss at step 4:
    every rank must stop at that step with the same error (none may wait on the others)."""
    import os

    from attnlab import AttnlabError
    from attnlab.models import Trainer
    from attnlab.models.parallel import setup

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    par = setup(None, cp, timeout_s=30)
    t = Trainer.start("tiny", out=out, parallel=par, max_steps=8, eval_interval=2, batch_size=2,
                      eval_batches=1, model_overrides={"n_layer": 1, "n_embd": 16, "n_head": 2,
                                                       "block_size": 16})
    t.run(stop_after=2)
    if rank == world - 1:
        t.model.lm_head.register_forward_hook(
            lambda m, i, o: o * float("nan") if t.step == 3 else o)
    try:
        t.run()
    except AttnlabError as e:
        return {"step": t.step, "error": str(e), "every_rank": getattr(e, "every_rank", False)}
    return {"step": t.step, "error": None}


def a_stop_on_one_rank_stops_every_rank(rank: int, world: int, out: str, cp: int) -> dict:
    """Ctrl-C reaches rank `world - 1` alone during step 4 (the launcher forwards it at its own
    moment): every rank must finish step 4, rank 0 save it, and all raise KeyboardInterrupt."""
    import os

    from attnlab.models import Trainer
    from attnlab.models.parallel import setup

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    par = setup(None, cp, timeout_s=30)
    t = Trainer.start("tiny", out=out, parallel=par, max_steps=50, eval_interval=2, batch_size=2,
                      eval_batches=1, model_overrides={"n_layer": 1, "n_embd": 16, "n_head": 2,
                                                       "block_size": 16})
    if rank == world - 1:
        t.model.lm_head.register_forward_hook(
            lambda m, i, o: (t.request_stop(), o)[1] if t.step == 3 else o)
    try:
        t.run()
    except KeyboardInterrupt:
        return {"step": t.step, "stopped": True}
    return {"step": t.step, "stopped": False}


def all_cases(rank: int, world: int, root: str) -> dict:
    """Every case above in one spawned group (spawning and importing cost seconds per process)."""
    return {"exact": loss_and_grads_match(rank, world, 29),
            **{f"nan_cp{cp}": nan_on_one_rank_stops_all(rank, world, f"{root}/cp{cp}", cp)
               for cp in (1, 2)},
            **{f"stop_cp{cp}": a_stop_on_one_rank_stops_every_rank(rank, world,
                                                                  f"{root}/stop{cp}", cp)
               for cp in (1, 2)}}
