"""The only place attnlab.distributed calls torch.distributed, and the record of what it moved.

Every operation goes through one function here, which logs its name, phase and bytes when a
`record()` block is active. Bytes are the logical payload per rank, the same quantities the cost
model predicts:

- all-gather of a part of b bytes over P ranks: sent (P−1)·b, received (P−1)·b;
- reduce-scatter to a part of b bytes: sent (P−1)·b, received (P−1)·b;
- all-to-all of an input of b bytes: sent (P−1)/P·b, received (P−1)/P·b;
- send / receive: the tensor's bytes, to / from one peer.

and messages, the count the cost model charges a latency for: a send is one message out, a
receive one in; a collective over P ranks counts P−1 each way (the ring algorithm's steps for
all-gather and reduce-scatter, one exchange with each peer for all-to-all).

No rank waits without a timeout: every blocking call waits on the process group, whose timeout
(set where the group was made, see `attnlab.distributed.init`) turns a missing peer into an error.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from attnlab.errors import AttnlabError


@dataclass
class Op:
    """One communication call as it ran on this rank."""

    name: str  # all_gather, reduce_scatter, all_to_all, send, recv
    phase: str  # validate, forward, backward, shard, unshard
    sent: int  # bytes this rank sent
    received: int  # bytes this rank received
    peer: int | None = None  # group rank of the other side (send / recv)
    seconds: float = 0.0  # wall time of the blocking call or of the wait
    msgs_out: int = 0  # messages this rank sent
    msgs_in: int = 0  # messages this rank received


@dataclass
class CommLog:
    """Everything communicated inside a `record()` block, and the block pairs computed."""

    ops: list[Op] = field(default_factory=list)
    #: (query rows, key rows) of each block pair a rank attended, forward only
    pairs: list[tuple[int, int]] = field(default_factory=list)

    def total(self, phase: str | None = None, what: str = "sent") -> int:
        return sum(getattr(o, what) for o in self.ops if phase is None or o.phase == phase)

    def seconds(self, phase: str | None = None) -> float:
        return sum(o.seconds for o in self.ops if phase is None or o.phase == phase)

    def count(self, name: str, phase: str | None = None) -> int:
        return sum(1 for o in self.ops if o.name == name and (phase is None or o.phase == phase))

    def messages(self, phase: str | None = None, what: str = "sent") -> int:
        """Messages this rank sent (`what="sent"`) or received ("received") in `phase`."""
        attr = "msgs_out" if what == "sent" else "msgs_in"
        return sum(getattr(o, attr) for o in self.ops if phase is None or o.phase == phase)

    def bytes_by_peer(self, phase: str | None = None, what: str = "received") -> dict[int, int]:
        """{peer: bytes} of the point-to-point transfers of `phase`, one direction."""
        out: dict[int, int] = {}
        for o in self.ops:
            if o.peer is not None and (phase is None or o.phase == phase):
                out[o.peer] = out.get(o.peer, 0) + getattr(o, what)
        return {p: b for p, b in sorted(out.items()) if b}


_logs: list[CommLog] = []
#: what this process is doing, for the error a missing peer raises: [call number, phase]
_doing: list = [None]
_calls = [0]


def next_call() -> int:
    """Number this process's next context-parallel call (1, 2, ...): errors name it."""
    _calls[0] += 1
    return _calls[0]


@contextmanager
def during(call_no: int, phase: str) -> Iterator[None]:
    """Communication inside this block belongs to `phase` of context_parallel_attention call
    `call_no` (what a missing peer's error says it did not run)."""
    before = _doing[0]
    _doing[0] = (call_no, phase)
    try:
        yield
    finally:
        _doing[0] = before


def _activity(phase: str) -> str:
    if _doing[0] is None:
        return f"the {phase} communication"
    n, ph = _doing[0]
    return f"the {ph} of context_parallel_attention call {n}"


def _ranks(rs) -> str:
    rs = sorted(set(rs))
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def _last(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[-1][:200] if lines else type(e).__name__


@contextmanager
def record() -> Iterator[CommLog]:
    """Log every communication and computed block pair of attnlab.distributed on this rank.

        >>> with record() as log:          # doctest: +SKIP
        ...     out = context_parallel_attention(q, k, v, is_causal=True)
        >>> log.total("forward")           # bytes this rank sent in the forward pass
    """
    log = CommLog()
    _logs.append(log)
    try:
        yield log
    finally:
        _logs.remove(log)


def _log(op: Op) -> None:
    for log in _logs:
        log.ops.append(op)


def recording() -> bool:
    """Some `record()` is active on this rank."""
    return bool(_logs)


def log_pair(rows: int, cols: int) -> None:
    for log in _logs:
        log.pairs.append((rows, cols))


def nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


def rank_world(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def init_group(backend: str, *, timeout_s: float, init_method: str | None = None,
               rank: int | None = None, world: int | None = None) -> None:
    """Join the default process group, every wait bounded by `timeout_s` (without init_method:
    from the environment torchrun sets, RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    kw = {} if init_method is None else {"init_method": init_method, "rank": rank,
                                         "world_size": world}
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kw)


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def destroy_group() -> None:
    """Leave the default process group, if any (never raises)."""
    with contextlib.suppress(Exception):
        if is_initialized():
            dist.destroy_process_group()


def global_rank(group, r: int) -> int:
    return r if group is None else dist.get_global_rank(group, r)


def _collective(kind: str, phase: str, sent: int, world: int, call) -> None:
    """Run one collective and log it: `sent` bytes in P − 1 messages leave this rank and as many
    arrive."""
    t0 = time.perf_counter()
    try:
        call()
    except RuntimeError as e:  # the group's timeout or a peer that left
        me = rank_world(None)[0] if is_initialized() else 0
        raise AttnlabError(
            f"a rank of the group did not run {_activity(phase)}: rank {me} waited in its "
            f"{kind} ({time.perf_counter() - t0:.1f} s; every rank must make the same calls, "
            f"backward included, in the same order) [{_last(e)}]") from e
    _log(Op(kind, phase, sent, sent, seconds=time.perf_counter() - t0, msgs_out=world - 1,
            msgs_in=world - 1))


def all_gather(out: torch.Tensor, part: torch.Tensor, group, phase: str) -> None:
    """out (P·numel(part),) ← every rank's `part`, in rank order."""
    _, P = rank_world(group)
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    # every rank's part -> every rank: (P − 1)·numel(part)·bytes in and out
    _collective("all_gather", phase, (P - 1) * nbytes(part), P,
                lambda: fn(out, part.contiguous(), group=group))


def reduce_scatter(out: torch.Tensor, full: torch.Tensor, group, phase: str) -> None:
    """out (numel(full)/P,) ← the sum over ranks of this rank's slice of `full`."""
    _, P = rank_world(group)
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    # each slice of full -> its owner: (P − 1)·numel(out)·bytes in and out
    _collective("reduce_scatter", phase, (P - 1) * nbytes(out), P,
                lambda: fn(out, full.contiguous(), group=group))


def all_to_all(out: torch.Tensor, inp: torch.Tensor, group, phase: str) -> None:
    """out[j] ← rank j's inp[me], equal splits along dim 0 (P parts)."""
    _, P = rank_world(group)
    # P − 1 of the P parts of inp leave this rank, as many arrive
    _collective("all_to_all", phase, (P - 1) * nbytes(inp) // P, P,
                lambda: dist.all_to_all_single(out, inp.contiguous(), group=group))


class Exchange:
    """Point-to-point sends and receives posted together (`batch_isend_irecv`), waited on later,
    so the caller can compute while they travel."""

    def __init__(self, group, phase: str):
        self.group, self.phase = group, phase
        self.ops: list = []
        self.logged: list[Op] = []
        self.works: list = []
        self.expected: list[tuple[int, str]] = []  # (peer, what it was to do)
        self.activity = _activity(phase)

    def send(self, x: torch.Tensor, peer: int, tag: int, what: str = "a tensor") -> None:
        x = x.contiguous()
        self.ops.append(dist.P2POp(dist.isend, x, global_rank(self.group, peer), self.group, tag))
        self.logged.append(Op("send", self.phase, nbytes(x), 0, peer, msgs_out=1))
        self.expected.append((peer, f"to receive {what}"))

    def recv(self, x: torch.Tensor, peer: int, tag: int, what: str = "a tensor") -> torch.Tensor:
        self.ops.append(dist.P2POp(dist.irecv, x, global_rank(self.group, peer), self.group, tag))
        self.logged.append(Op("recv", self.phase, 0, nbytes(x), peer, msgs_in=1))
        self.expected.append((peer, f"to send {what}"))
        return x

    def post(self) -> Exchange:
        if self.ops:
            try:
                self.works = dist.batch_isend_irecv(self.ops)
            except RuntimeError as e:  # a peer that already left
                raise self._silent(e, 0.0) from e
        return self

    def wait(self) -> None:
        t0 = time.perf_counter()
        try:
            for w in self.works:
                w.wait()
        except RuntimeError as e:  # the group's timeout or a peer that left
            self.works = []
            raise self._silent(e, time.perf_counter() - t0) from e
        self.works = []
        self.ops = []  # the sent tensors (copies, often) are freed once they have gone
        if self.logged:
            self.logged[0].seconds = time.perf_counter() - t0
        for op in self.logged:
            _log(op)
        self.logged = []

    def _silent(self, e: BaseException, waited: float) -> AttnlabError:
        """The error of a wait that failed: the peers it expected and what each was to do."""
        me = rank_world(self.group)[0]
        peers = [p for p, _ in self.expected]
        whats = "; ".join(dict.fromkeys(f"rank {p} {w}" for p, w in self.expected))
        return AttnlabError(
            f"{_ranks(peers)} did not run {self.activity}: rank {me} waited {waited:.1f} s "
            f"for it ({whats}); every rank must make the same calls, backward included, in the "
            f"same order [{_last(e)}]")


def group_ranks(group) -> list[int]:
    """The global ranks of `group` (None: the whole world), in group order."""
    return dist.get_process_group_ranks(dist.group.WORLD if group is None else group)


def is_world(group) -> bool:
    return group is None or group is dist.group.WORLD


def group_timeout(group, default_s: float) -> float:
    """The timeout `group` was made with, seconds (`default_s` where it cannot be read)."""
    try:
        g = dist.group.WORLD if group is None else group
        return g._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except Exception:  # a backend without readable options
        return default_s


def new_group(ranks: list[int], timeout_s: float, local: bool):
    """A process group of the global `ranks`, every wait bounded by `timeout_s`; `local`: only
    its members take part (torch's use_local_synchronization), else every process enters."""
    return dist.new_group(ranks, timeout=datetime.timedelta(seconds=timeout_s),
                          use_local_synchronization=local)


def backend(group) -> str:
    return str(dist.get_backend(group)) if is_initialized() else "none"
