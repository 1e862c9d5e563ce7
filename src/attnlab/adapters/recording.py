"""Recording what each attention call of a model did, for looking inside afterwards.

    >>> with record() as calls:
    ...     model(**inputs)             # a model running on attnlab (see attnlab.adapters.hf)
    >>> calls[0].weights.shape          # (B, H, L, S), float64

Each call is an `attnlab.capture.AttentionCall`, the record every model runner makes;
`attnlab.capture.ModelAttention.from_calls(calls, tokens, model_name=...)` turns the calls of one
text into every layer's attention. Recording is off unless a `record()` block is active in
this thread/context, so a model running on attnlab pays nothing for it.
Caution: every call keeps float64 copies of q, k, v and the weights on the CPU; record short
texts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from attnlab.capture import AttentionCall

__all__ = ["AttentionCall", "add", "record", "recording"]

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
