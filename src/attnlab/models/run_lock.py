"""One writer per run directory: a lock file naming its holder.

    DIR/.attnlab-lock    {"pid": 4242, "host": "laptop", "since": "2026-12-02T16:20:00Z"}

A process that will write checkpoints to DIR (a training run in one process, the launcher of
`attnlab train --nproc N` on behalf of its workers, rank 0 of a torchrun job) takes the lock first;
a second one is refused with an AttnlabError naming the holder. Where the OS has `flock` (Linux,
macOS) the lock is an advisory lock on the open file: the kernel drops it when the holder dies,
however it dies, so a lock file whose lock is free is stale and is taken over, with a warning
naming the pid that left it. Elsewhere the file alone decides: it is stale when the pid it names
ran on this host and is gone.

A worker started by the launcher that holds the lock (its parent, named in the lock file) writes
under its launcher's lock. Caution: another host sees a lock only through a filesystem that
carries `flock` between hosts (NFSv4 does; some network filesystems do not).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from pathlib import Path

from attnlab.errors import AttnlabError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

log = logging.getLogger(__name__)

LOCK_FILE = ".attnlab-lock"


class RunLock:
    """The lock on run directory `directory`; `acquire()` / `release()`, or `with RunLock(d):`."""

    def __init__(self, directory, *, what: str = "out"):
        self.path = Path(directory) / LOCK_FILE
        self.what = what
        self._fd: int | None = None
        self._borrowed = False  # held by our launcher, on our behalf

    @property
    def held(self) -> bool:
        return self._fd is not None or self._borrowed

    def acquire(self) -> RunLock:
        if self.held:
            return self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            for _ in range(20):  # retried only when the holder released it while we looked
                if self._try_acquire():
                    return self
        except OSError as e:
            raise AttnlabError(f"{self.what}: cannot lock {self.path.parent} "
                               f"({e.strerror or e})") from None
        raise AttnlabError(f"{self.what}: could not lock {self.path.parent} (its lock file kept "
                           "changing)")

    def release(self) -> None:
        if self._fd is None:
            self._borrowed = False
            return
        fd, self._fd = self._fd, None
        # remove the file while still holding the lock, so no one locks the old file after us
        with contextlib.suppress(OSError):
            if _same_file(fd, self.path):
                self.path.unlink()
        os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    # -- internals -----------------------------------------------------------------------------

    def _try_acquire(self) -> bool:
        if fcntl is None:  # pragma: no cover - Windows
            return self._try_acquire_by_pid()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(fd)
            os.close(fd)
            if self._launcher_holds(holder):
                self._borrowed = True
                return True
            raise AttnlabError(self._refusal(holder)) from None
        if not _same_file(fd, self.path):  # the holder removed it between our open and flock
            os.close(fd)
            return False
        left = _read_holder(fd)
        if left and left.get("pid") != os.getpid():
            log.warning("%s: took over the stale lock of %s, which is no longer running",
                        self.path.parent, _describe(left))
        _write_holder(fd)
        self._fd = fd
        return True

    def _try_acquire_by_pid(self) -> bool:  # pragma: no cover - Windows
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            with open(self.path, "rb") as f:
                holder = _parse_holder(f.read())
            if self._launcher_holds(holder):
                self._borrowed = True
                return True
            if not _stale(holder):
                raise AttnlabError(self._refusal(holder)) from None
            log.warning("%s: took over the stale lock of %s, which is no longer running",
                        self.path.parent, _describe(holder))
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            return False
        _write_holder(fd)
        self._fd = fd
        return True

    def _launcher_holds(self, holder: dict | None) -> bool:
        """True in a worker whose launcher (its parent process) holds the lock."""
        from attnlab.models.launch import LOCAL_LAUNCH_ENV

        return (bool(holder) and LOCAL_LAUNCH_ENV in os.environ
                and holder.get("pid") == os.getppid() and holder.get("host") == _host())

    def _refusal(self, holder: dict | None) -> str:
        return (f"{self.what}: {self.path.parent} is in use by {_describe(holder)}, which "
                "is writing checkpoints there; wait for it to finish or stop it, or choose "
                f"another directory (lock file {self.path})")


def _host() -> str:
    return socket.gethostname()


def _describe(holder: dict | None) -> str:
    if not holder:
        return "another process"
    since = f" since {holder['since']}" if holder.get("since") else ""
    return f"pid {holder.get('pid')} on {holder.get('host')}{since}"


def _read_holder(fd: int) -> dict | None:
    os.lseek(fd, 0, os.SEEK_SET)
    return _parse_holder(os.read(fd, 4096))


def _parse_holder(data: bytes) -> dict | None:
    try:
        holder = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return holder if isinstance(holder, dict) else None


def _write_holder(fd: int) -> None:
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    data = json.dumps({"pid": os.getpid(), "host": _host(), "since": since}).encode()
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, data + b"\n")
    os.fsync(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _stale(holder: dict | None) -> bool:  # pragma: no cover - Windows
    """A lock whose holder ran on this host and is gone (or that names no one)."""
    if not holder or not isinstance(holder.get("pid"), int):
        return True
    if holder.get("host") != _host():
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False
