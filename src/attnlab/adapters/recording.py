"""Recording what each attention call of a model did, for looking inside afterwards.

    >>> with record() as calls:
    ...     model(**inputs)             # a model running on attnlab (see attnlab.adapters.hf)
    >>> calls[0].weights.shape          # (B, H, L, S), float64

Recording is off unless a `record()` block is active in this thread/context, so a model running on
attnlab pays nothing for it. Caution: every call keeps float64 copies of q, k, v and the weights
on the CPU; record short texts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch


@dataclass
class AttentionCall:
    """One attention call: per-head query (B, H, L, D), key (B, H, S, D), value (B, H, S, Dv)
    (k/v heads repeated for GQA, queries before scaling), allowed (B, 1|H, L, S) bool (True = may
    attend), weights (B, H, L, S) the softmax weights the model used; all float64 on the CPU.

    The record reproduces the weights: s = query @ keyᵀ · scale, then softcap · tanh(s / softcap)
    when `softcap` is set (Gemma 2), then + `bias` (B, 1|H, L, S) when set (T5's position bias,
    a float mask), and softmax over the allowed keys (a row with none: all 0)."""

    layer: int | None
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    allowed: torch.Tensor
    weights: torch.Tensor
    scale: float
    causal: bool
    bias: torch.Tensor | None = None
    softcap: float | None = None


_ACTIVE: ContextVar[list[AttentionCall] | None] = ContextVar("attnlab_recording", default=None)


@contextmanager
def record() -> Iterator[list[AttentionCall]]:
    """Collect an `AttentionCall` for every attention call made inside the block, in call order."""
    calls: list[AttentionCall] = []
    token = _ACTIVE.set(calls)
    try:
        yield calls
    finally:
        _ACTIVE.reset(token)


def recording() -> bool:
    return _ACTIVE.get() is not None


def add(call: AttentionCall) -> None:
    calls = _ACTIVE.get()
    if calls is not None:
        calls.append(call)
