"""The training schedule: the learning rate of each step (linear warm-up, then cosine decay to a
floor), a config with a new peak, floor or warm-up, and the AdamW optimizer the Trainer steps."""

from __future__ import annotations

import math

import torch

from attnlab.errors import AttnlabError
from attnlab.models.config import TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up, then cosine to min_lr."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    t = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * t)) * (cfg.lr - cfg.min_lr)


def with_schedule(cfg: TrainConfig, *, lr: float | None = None, min_lr: float | None = None,
                  warmup_steps: int | None = None) -> TrainConfig:
    """`cfg` with a new peak learning rate, floor and warm-up. A new `lr` without `min_lr` moves
    the floor with it (the same min_lr / lr ratio), so the schedule keeps its shape."""
    for name, v in (("lr", lr), ("min_lr", min_lr)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not math.isfinite(v) or v <= 0):
            raise AttnlabError(f"{name}: expected a finite number > 0, got {v!r}")
    if warmup_steps is not None and (isinstance(warmup_steps, bool)
                                     or not isinstance(warmup_steps, int) or warmup_steps < 0):
        raise AttnlabError(f"warmup_steps: expected an integer >= 0, got {warmup_steps!r}")
    new_lr = cfg.lr if lr is None else float(lr)
    if min_lr is None:
        min_lr = cfg.min_lr if lr is None else cfg.min_lr * new_lr / cfg.lr
    if min_lr > new_lr:
        raise AttnlabError(f"min_lr: expected at most lr = {new_lr:g} (the schedule decays from "
                           f"lr to min_lr), got {min_lr:g}")
    warm = cfg.warmup_steps if warmup_steps is None else warmup_steps
    return TrainConfig.from_dict({**cfg.to_dict(), "lr": new_lr, "min_lr": float(min_lr),
                                  "warmup_steps": warm})


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices and embeddings only (not biases or LayerNorm gains)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
