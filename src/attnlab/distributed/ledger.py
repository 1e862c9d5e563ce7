"""TensorLedger: the live tensor bytes a piece of code holds, counted from the allocations of
every aten op it runs — how the memory tests and `benchmarks/distributed.py --memory` see where
a context-parallel call's memory goes.

    >>> with TensorLedger() as ledger:                       # doctest: +SKIP
    ...     attention(q, k, v).sum().backward()
    >>> ledger.peak / 2**20, ledger.at_peak[:3]              # MiB; the largest storages then

A storage counts from the op that creates it until it is freed (a weakref finalizer on the
storage); views, and outputs that share an argument's storage, count nothing. Memory a kernel
allocates outside torch, and the allocator's slack, are not seen (the benchmark's RSS column is).
"""

from __future__ import annotations

import traceback
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class TensorLedger(TorchDispatchMode):
    """Live tensor bytes while active: `bytes` now, `peak` the most at once, `at_peak` the
    storages live then ((op, shape, MiB), largest first) and `where` the attnlab frames of the
    allocation that set it."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple] = {}
        self.bytes = self.peak = 0
        self.at_peak: list = []
        self.where: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {t.untyped_storage().data_ptr()
                for t in _tensors([*args, *(kwargs or {}).values()])}
        for t in _tensors(out):
            st = t.untyped_storage()
            key = st.data_ptr()
            if key in self.live or key in seen or st.nbytes() == 0:
                continue  # known, or a view of an argument
            self.live[key] = (func.overloadpacket.__name__, tuple(t.shape), st.nbytes())
            self.bytes += st.nbytes()
            weakref.finalize(st, self._free, key)
            if self.bytes > self.peak:
                self._new_peak()
        return out

    def _new_peak(self) -> None:
        self.peak = self.bytes
        self.at_peak = sorted(((o, sh, n / 2**20) for o, sh, n in self.live.values()),
                              key=lambda x: -x[2])
        self.where = [f"{f.name}:{f.lineno}" for f in traceback.extract_stack()
                      if "attnlab" in f.filename][-4:]

    def _free(self, key: int) -> None:
        entry = self.live.pop(key, None)
        if entry is not None:
            self.bytes -= entry[2]


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (tuple, list)):
        for y in x:
            yield from _tensors(y)
