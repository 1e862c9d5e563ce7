"""Training across processes: the context-parallel GPT equals the one-process GPT; `attnlab train
--nproc 2` with --dp 2 and --cp 2 gives the one-process loss curve and weights; Ctrl-C saves a step
every rank agrees on, and the checkpoint resumes under another layout and in one process on the
same curve; a killed worker stops the run with a clear message."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from attnlab import AttnlabError
from attnlab.cli import main
from attnlab.distributed import ContextParallel
from attnlab.models import GPT, GPTConfig, Trainer, load_checkpoint
from attnlab.models.launch import describe_failures

STEPS, BATCH, EVERY = 20, 8, 10


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """(root, each rank's results) of the cases in models/parallel_cases.py, on one group of 2."""
    from distributed.harness import run_group
    from models.parallel_cases import all_cases

    root = tmp_path_factory.mktemp("group")
    return root, run_group(all_cases, 2, str(root), timeout_s=240)


def test_context_parallel_gpt_equals_one_process_in_float64(group):
    # L = 29: zigzag over 2 ranks gives them 13 and 16 rows (uneven chunks); rotary and learned
    # positions must be the global ones or the loss would differ
    for rank_result in group[1]:
        for name, (dloss, dgrad, local_rows) in rank_result["exact"].items():
            assert local_rows < 29, name
            assert dloss < 1e-12 and dgrad < 1e-12, f"{name}: loss {dloss:.2e}, grad {dgrad:.2e}"


@pytest.mark.parametrize("cp", [1, 2])
def test_a_nan_on_one_rank_stops_every_rank_at_that_step(group, cp):
    root, results = group
    out = root / f"cp{cp}"
    for r in (res[f"nan_cp{cp}"] for res in results):
        assert r["step"] == 3 and r["every_rank"], results
        assert r["error"].startswith("the training loss is nan at step 4"), r["error"]
        assert f"{out} keeps its checkpoint of step 2" in r["error"]
    assert json.loads((out / "attnlab.json").read_text())["state"]["step"] == 2


@pytest.mark.parametrize("cp", [1, 2])
def test_ctrl_c_on_one_rank_stops_every_rank_after_the_same_step(group, cp):
    root, results = group
    assert [r[f"stop_cp{cp}"] for r in results] == [{"step": 4, "stopped": True}] * 2, results
    doc = json.loads((root / f"stop{cp}" / "attnlab.json").read_text())
    assert doc["state"]["step"] == 4 and len(doc["state"]["history"]) == 4


def test_a_handle_of_one_process_changes_nothing():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=1, n_head=2, n_embd=16,
                          rotary=True))
    x = torch.randint(0, 11, (3, 13))
    logits, loss = model(x, x)
    model.set_context_parallel(ContextParallel())  # no group initialised: one process
    logits_cp, loss_cp = model(x, x)
    torch.testing.assert_close(logits_cp, logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(loss_cp, loss, rtol=1e-6, atol=0)
    with pytest.raises(AttnlabError, match="whole sequence"):
        model(x[:, :2], caches=model.new_caches(3))
    with pytest.raises(AttnlabError, match="positions"):
        model.blocks[0].attn(torch.zeros(1, 4, 16))
    model.set_context_parallel(None)
    assert torch.equal(model(x, x)[0], logits)


@pytest.mark.parametrize("argv, needles", [
    (["--nproc", "3", "--cp", "2"], ["N = D × C", "N = 3"]),
    (["--nproc", "4", "--dp", "3"], ["N = D × C"]),
    (["--cp", "0"], ["--cp: expected a positive number"]),
])
def test_bad_layouts_give_one_clear_line(capsys, tmp_path, argv, needles):
    assert main(["train", "--out", str(tmp_path / "r"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(n in err for n in needles), err


def test_a_torchrun_worker_refuses_what_needs_one_process(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "--out", str(tmp_path / "r"), "--track-heads"]) == 2
    assert "--track-heads: one process only" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "r"), "--nproc", "4"]) == 2
    assert "--nproc: 4, but torchrun started 2 processes" in capsys.readouterr().err


def test_failures_are_named_cause_first():
    def f(pid, code, ts):
        return SimpleNamespace(pid=pid, exitcode=code, timestamp=ts)

    msg = describe_failures({0: f(10, -signal.SIGTERM, 5), 1: f(11, -signal.SIGKILL, 6)}, 2)
    assert msg == ("the run of 2 processes stopped: rank 1 (pid 11) was killed by SIGKILL; "
                   "rank 0 (pid 10) was stopped")
    assert describe_failures({2: f(3, 2, 0)}, 4) == (
        "the run of 4 processes stopped: rank 2 (pid 3) exited with code 2 (the workers' "
        "messages are above)")


def _attnlab(*args, check=True, timeout=300):
    """`python -m attnlab ARGS` in a fresh process (the launcher starts the workers)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.run([sys.executable, "-m", "attnlab", *args], capture_output=True, text=True,
                       timeout=timeout, env=env)
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def _curve(out) -> list[float]:
    return [h["loss"] for h in json.loads((out / "attnlab.json").read_text())["state"]["history"]]


def _assert_same_run(a: list[float], b: list[float], model_a, model_b, what: str):
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b)):
        assert abs(x - y) <= 1e-4 * abs(y), f"{what}: step {i + 1}: loss {x} vs {y}"
    for (name, p), q in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        d = (p - q).abs().max().item()
        assert d <= 1e-4, f"{what}: {name} differs by {d:.2e}"


@pytest.mark.slow
def test_20_fresh_steps_with_dp2_with_cp2_and_in_one_process_agree(tmp_path, capsys):
    common = ["train", "--preset", "tiny", "--max-steps", str(STEPS), "--batch-size",
              str(BATCH), "--eval-interval", str(EVERY), "--quiet", "--threads", "1"]
    assert main([*common, "--out", str(tmp_path / "one")]) == 0
    one = load_checkpoint(tmp_path / "one")[0]
    ref = _curve(tmp_path / "one")
    assert len(ref) == STEPS and ref[-1] < ref[0] - 0.5  # it learns: the curves can differ
    for layout in (["--dp", "2"], ["--cp", "2"]):
        out = tmp_path / layout[0].strip("-")
        _attnlab(*common, "--out", str(out), "--nproc", "2", *layout)
        _assert_same_run(_curve(out), ref, load_checkpoint(out)[0], one, " ".join(layout))
        assert not (out / ".attnlab-lock").exists()  # the launcher released the run's lock


@pytest.mark.slow
def test_ctrl_c_saves_a_step_every_rank_agrees_on_and_resume_continues_the_curve(tmp_path):
    """SIGINT to the launcher's process group, as Ctrl-C sends it; the (2, 1) checkpoint then
    continues as (1, 2) and in one process on the one-process curve."""
    out = tmp_path / "run"
    # warm-up covers every step this test can reach, so a shorter --max-steps on resume keeps
    # the same learning rates; --lr and --warmup-steps travel to the workers and the checkpoint;
    # no periodic checkpoint: the one there is after Ctrl-C is the one Ctrl-C saved
    sched = {"lr": 2e-3, "warmup_steps": 200, "batch_size": BATCH, "eval_interval": 1000}
    cmd = [sys.executable, "-m", "attnlab", "train", "--nproc", "2", "--dp", "2", "--max-steps",
           "200", "--lr", "2e-3", "--warmup-steps", "200", "--batch-size", str(BATCH),
           "--eval-interval", "1000", "--out", str(out), "--quiet", "--timeout", "60"]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # its own group, like a shell's job
    lines, training = [], threading.Event()

    def read_stderr():
        for line in launcher.stderr:
            lines.append(line)
            if "steps 0 -> 200" in line:  # rank 0's header: training starts now
                training.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert training.wait(180), "".join(lines)[-3000:]
        time.sleep(0.5)
        os.killpg(launcher.pid, signal.SIGINT)
        launcher.wait(timeout=90)
        reader.join(10)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    err = "".join(lines)
    assert launcher.returncode == 130, err[-3000:]
    doc = json.loads((out / "attnlab.json").read_text())
    step = doc["state"]["step"]
    assert 0 < step < 200 and len(doc["state"]["history"]) == step, err[-3000:]
    assert (doc["train"]["lr"], doc["train"]["warmup_steps"]) == (2e-3, 200)
    said = [line for line in err.splitlines() if "interrupted" in line]
    assert said == [f"attnlab train: interrupted. {out} keeps the checkpoint of step {step}; "
                    f"continue with: attnlab train --out {out} --resume --nproc 2"], err[-3000:]

    end = step + 3
    whole = Trainer.start("tiny", max_steps=200, min_lr=2e-4, **sched)
    whole.run(stop_after=end)
    ref = [h["loss"] for h in whole.history]
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    _attnlab("train", "--out", str(out), "--resume", "--max-steps", str(end), "--nproc", "2",
             "--cp", "2", "--quiet")
    _assert_same_run(_curve(out), ref, load_checkpoint(out)[0], whole.model,
                     "--dp 2 stopped by Ctrl-C, resumed with --cp 2")
    one = Trainer.resume(copy, max_steps=end)
    one.run()
    _assert_same_run([h["loss"] for h in one.history], ref, one.model, whole.model,
                     "--dp 2 stopped by Ctrl-C, resumed in one process")


@pytest.mark.slow
def test_a_killed_worker_stops_the_run_with_a_clear_message(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "attnlab", "train", "--nproc", "2", "--max-steps", "100000",
           "--batch-size", str(BATCH), "--eval-interval", str(EVERY), "--out", str(out),
           "--quiet", "--timeout", "60"]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not (out / "attnlab.json").exists():
            assert launcher.poll() is None, launcher.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 180 s"
            time.sleep(0.2)
        victim = _worker_pid(launcher.pid, rank=1)
        os.kill(victim, signal.SIGKILL)
        _, err = launcher.communicate(timeout=60)  # stops well within the group timeout
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert f"rank 1 (pid {victim}) was killed by SIGKILL" in last, err[-3000:]
    assert "--resume" in last and "keeps the checkpoint of step" in last, last
    step = json.loads((out / "attnlab.json").read_text())["state"]["step"]
    assert load_checkpoint(out)[0].config.name == "tiny"  # the last checkpoint is whole
    assert main(["train", "--out", str(out), "--resume", "--max-steps", str(step + 1),
                 "--quiet", "--threads", "1"]) == 0


def _worker_pid(launcher: int, rank: int) -> int:
    """The pid of the launcher's worker with RANK=rank (Linux /proc)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for task in os.listdir(f"/proc/{launcher}/task"):
            with open(f"/proc/{launcher}/task/{task}/children") as f:
                for pid in map(int, f.read().split()):
                    with open(f"/proc/{pid}/environ", "rb") as env:
                        if f"RANK={rank}".encode() in env.read().split(b"\0"):
                            return pid
        time.sleep(0.2)
    raise AssertionError(f"no worker with RANK={rank} under pid {launcher}")
