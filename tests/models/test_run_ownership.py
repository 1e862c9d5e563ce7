"""One writer per run directory, and no orphans: a second trainer on a directory is refused with
the holder's pid and host, a lock left by a dead process is taken over with a message, the workers
of `attnlab train --nproc 2` die with their launcher (kill -9 included), and bad --timeout values
are one line before any worker starts."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from attnlab import AttnlabError
from attnlab.cli import main
from attnlab.models import Trainer, load_checkpoint
from attnlab.models.run_lock import LOCK_FILE, RunLock

SMALL = {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16}
RUN = {"model_overrides": SMALL, "max_steps": 2, "batch_size": 2, "eval_batches": 1}

HOLD = ("import sys; from attnlab.models.run_lock import RunLock; "
        "lock = RunLock(sys.argv[1]).acquire(); print('held', flush=True); sys.stdin.read()")


@pytest.fixture
def held(tmp_path):
    """A directory whose lock another live process holds (until the test ends)."""
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield out, holder.pid
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_second_trainer_on_a_directory_is_refused(held, capsys, monkeypatch):
    out, pid = held
    needle = f"is in use by pid {pid} on {socket.gethostname()}"
    with pytest.raises(AttnlabError, match=needle):
        Trainer.start("tiny", out=out, **RUN).run()
    assert not (out / "attnlab.json").exists()  # refused before any step or save
    assert main(["train", "--out", str(out), "--max-steps", "2", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "out:" in err, err
    from attnlab.models import launch

    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("workers started"))
    assert main(["train", "--out", str(out), "--nproc", "2", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_a_save_outside_run_is_refused_too(held, tmp_path):
    out, pid = held
    t = Trainer.start("tiny", out=out, **RUN)
    with pytest.raises(AttnlabError, match=f"in use by pid {pid}"):
        t.save()
    assert not (out / "attnlab.json").exists()


def test_a_stale_lock_is_taken_over_with_a_message(tmp_path, caplog):
    out = tmp_path / "run"
    out.mkdir()
    dead = _dead_pid()
    (out / LOCK_FILE).write_text(json.dumps({"pid": dead, "host": socket.gethostname(),
                                             "since": "2026-01-01T00:00:00Z"}))
    with caplog.at_level(logging.WARNING):
        Trainer.start("tiny", out=out, **RUN).run()
    said = [r.getMessage() for r in caplog.records if "stale lock" in r.getMessage()]
    assert said == [f"{out}: took over the stale lock of pid {dead} on {socket.gethostname()} "
                    "since 2026-01-01T00:00:00Z, which is no longer running"], said
    assert load_checkpoint(out)[0].config.n_layer == 1
    assert not (out / LOCK_FILE).exists()  # released when the run ended


def test_the_lock_is_released_and_taken_again_in_one_process(tmp_path):
    out = tmp_path / "run"
    Trainer.start("tiny", out=out, **RUN).run()
    t = Trainer.resume(out, max_steps=3)
    t.run()
    assert t.step == 3 and not (out / LOCK_FILE).exists()
    with RunLock(out) as lock:
        assert lock.held and json.loads((out / LOCK_FILE).read_text())["pid"] == os.getpid()
        with pytest.raises(AttnlabError, match="in use by pid"):
            RunLock(out).acquire()  # a second writer in the same process is refused too
    assert not (out / LOCK_FILE).exists()


@pytest.mark.parametrize("timeout", ["nan", "0", "-1", "inf"])
def test_a_bad_timeout_is_one_line_before_any_worker_starts(capfd, tmp_path, monkeypatch,
                                                            timeout):
    from attnlab.models import launch

    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("workers started"))
    argv = ["train", "--nproc", "2", "--timeout", timeout, "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    err = capfd.readouterr().err.strip()
    assert err.splitlines() == [f"attnlab train: error: --timeout: expected a positive number "
                                f"of seconds, got {float(timeout)}"], err


def _children(pid: int) -> list[int]:
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += map(int, f.read().split())
    return kids


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_the_launcher_takes_the_workers_down(tmp_path, caplog):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "attnlab", "train", "--nproc", "2", "--max-steps", "100000",
           "--batch-size", "4", "--eval-interval", "2", "--out", str(out), "--quiet",
           "--timeout", "60"]
    launcher = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while not (out / "attnlab.json").exists():
            assert launcher.poll() is None, launcher.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 180 s"
            time.sleep(0.2)
        workers = _children(launcher.pid)
        assert len(workers) == 2, workers
        with pytest.raises(AttnlabError, match=f"in use by pid {launcher.pid}"):
            Trainer.resume(out).run()  # a second writer while the run lives
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 15
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_alive, workers)), "the workers outlived their launcher"
        before = (out / "attnlab.json").read_bytes()
        time.sleep(1.0)  # at 2 steps a checkpoint, a living worker would save well within this
        assert (out / "attnlab.json").read_bytes() == before
    finally:
        for pid in [launcher.pid, *workers]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        launcher.wait(timeout=30)
    step = json.loads(before)["state"]["step"]
    with caplog.at_level(logging.WARNING):  # the dead launcher's lock is taken over
        t = Trainer.resume(out, max_steps=step + 1)
        t.run()
    assert t.step == step + 1
    assert any(f"stale lock of pid {launcher.pid}" in r.getMessage() for r in caplog.records)


def test_a_directory_that_cannot_hold_the_lock_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(AttnlabError, match=r"out: cannot lock .*file/run \(Not a directory\)"):
        RunLock(tmp_path / "file" / "run").acquire()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("direct", [True, False])
def test_a_worker_ends_itself_when_its_launcher_is_gone(direct):
    """A stand-in launcher (a shell) starts a worker that calls die_with_launcher, directly or
    through an intermediate process, then is killed with SIGKILL."""
    worker = ("import os, sys, time; from attnlab.models.launch import die_with_launcher; "
              "assert die_with_launcher(poll_s=0.05); print(os.getpid(), flush=True); "
              "time.sleep(60)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "ATTNLAB_LOCAL_LAUNCH": "1"}
    inner = f"{sys.executable} -c '{worker}'"
    # the shell exports its own pid as the launcher's, then runs the worker (behind a second
    # shell when not direct) and waits
    script = (f'export ATTNLAB_LAUNCHER_PID=$$; {inner} & wait' if direct
              else f'export ATTNLAB_LAUNCHER_PID=$$; sh -c "{inner}; :" & wait')
    launcher = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=env)
    pid = 0
    try:
        pid = int(launcher.stdout.readline())
        assert _alive(pid)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 15
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the worker outlived its launcher"
    finally:
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
