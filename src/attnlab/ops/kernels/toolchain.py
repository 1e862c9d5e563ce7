"""The tools a kernel build needs around `cpp_extension.load` (`build._compile`): ninja on PATH,
and the file lock under which one process builds while the others wait (up to LOCK_WAIT_S)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
from pathlib import Path

from attnlab.ops.kernels.isa import KernelUnavailable

LOCK_WAIT_S = 900.0


@contextlib.contextmanager
def ninja_on_path():
    """The ninja of the `ninja` package on PATH for the build (a venv's bin is often not)."""
    old = os.environ.get("PATH", "")
    try:
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + old
    except ImportError:
        if shutil.which("ninja") is None:
            raise KernelUnavailable("the ninja build tool is missing: pip install ninja") from None
    try:
        yield
    finally:
        os.environ["PATH"] = old


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive lock file (flock) for the build; waits up to LOCK_WAIT_S."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the rename alone keeps builds whole
        yield
        return
    with open(path, "a+") as f:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    raise KernelUnavailable(f"could not lock {path} for the kernel build") from e
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
