"""The decode kernel's own helper threads (csrc/helpers.h): started on first use, one per helper a
call asks for and reused by every later call, and started anew in a forked child, which has none
of its parent's threads. Their result is the one thread's, bit for bit."""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch

from attnlab.ops.kernels import build
from interval_cases import need_compiler

LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"),
                           reason="thread names are read from Linux's /proc")


@pytest.fixture(autouse=True)
def _compiler():
    need_compiler()


def helper_threads() -> int:
    """This process's threads named as the kernel names its helpers."""
    n = 0
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                n += f.read().strip() == "attnlab-helper"
        except OSError:
            continue  # a thread that ended
    return n


def call(threads: int):
    """A step big enough for a helper (GQA 32/8, 4k keys: 16 MiB of cache) on `threads`
    threads, its output; chunks of 512 keys whatever the thread count, so that the partials and
    their merge are the same and only which thread computes each differs."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 32, 1, 64, generator=g)
    k, v = (torch.randn(1, 8, 4096, 64, generator=g) for _ in range(2))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        return build.load(build.chosen_isa()).decode(q, k, v, None, None, None, 0.125, 0.0, 0,
                                                     512, False)[0]
    finally:
        torch.set_num_threads(before)


@LINUX
def test_helpers_are_started_once_and_reused():
    """Thirty 2-thread calls leave one helper thread (or as many as earlier calls started), three
    threads two: a thread started per call, or none (the work handed to another pool), fails."""
    one = call(1)
    before = helper_threads()
    for _ in range(30):
        assert torch.equal(call(2), one)
    time.sleep(0.05)  # a helper names itself when it first runs
    assert helper_threads() == max(before, 1)
    for _ in range(10):
        assert torch.equal(call(3), one)
    time.sleep(0.05)
    assert helper_threads() == max(before, 2)


@LINUX
def test_a_forked_child_starts_its_own_helper():
    """A child forked after the parent's helpers started has none of their threads: its 2-thread
    call starts a helper of its own (a queue the parent's threads were to serve would leave every
    item to the caller) and gives the one-thread bits. The child is given 60 s, then killed."""
    one = call(1)
    call(2)  # the parent's helper started
    pid = os.fork()
    if pid == 0:  # the child: nothing from pytest runs here, only the check and _exit
        ok = False
        try:
            ok = torch.equal(call(2), one) and (time.sleep(0.05) or helper_threads() == 1)
        finally:
            os._exit(0 if ok else 1)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's 2-thread call did not return in 60 s")
