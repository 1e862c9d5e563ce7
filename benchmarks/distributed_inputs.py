"""The inputs of benchmarks/distributed.py's calls, shared by its tables (one module, so the
paired table need not import the main script, which imports it)."""

from __future__ import annotations

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}


def inputs(cfg):
    """q (1, H, L, D), k and v (1, Hkv, L, D) of a Config, the same on every rank (seed 0)."""
    g = torch.Generator().manual_seed(0)
    dt = DTYPES[cfg.dtype]
    q = torch.randn(1, cfg.H, cfg.L, cfg.D, generator=g).to(dt)
    k = torch.randn(1, cfg.Hkv, cfg.L, cfg.D, generator=g).to(dt)
    v = torch.randn(1, cfg.Hkv, cfg.L, cfg.D, generator=g).to(dt)
    return q, k, v
