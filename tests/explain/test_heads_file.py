"""heads.jsonl survives a kill: each line goes to disk whole (flush + fsync) before training goes
on, and a torn last line is skipped with a warning by `read_heads`, `track-heads --plot-only` and
`plot --run`."""

from __future__ import annotations

import json
import os

import matplotlib  # noqa: F401  (the viz extra: missing, these tests fail, never skip)
import pytest

from attnlab import AttnlabError
from attnlab.cli import main
from attnlab.explain import training
from attnlab.explain.training import read_heads, track_heads
from attnlab.models import Trainer

GRID = {name: [[0.1, 0.2]] for name in ("induction", "max", "prev")}


def _run(tmp_path, tail: str):
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": s, "loss": loss, "val_loss": None, "stats": GRID, "labels": [["-", "-"]]}
             for s, loss in ((0, None), (5, 2.5))]
    (run / "heads.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines) + tail)
    return run


def test_a_torn_last_line_is_skipped_with_a_warning(tmp_path):
    run = _run(tmp_path, '{"step": 10, "loss": 2.1, "stats": {"indu')
    with pytest.warns(UserWarning, match="line 3 is torn"):
        lines = read_heads(run)
    assert [d["step"] for d in lines] == [0, 5]


def test_a_damaged_line_before_the_last_is_an_error(tmp_path):
    run = _run(tmp_path, "")
    path = run / "heads.jsonl"
    rows = path.read_text().splitlines()
    path.write_text(rows[0][:20] + "\n" + rows[1] + "\n")
    with pytest.raises(AttnlabError, match="line 1 is not a JSON object"):
        read_heads(run)


@pytest.mark.parametrize("command", [["track-heads", "--plot-only", "--out"], ["plot", "--model"]])
def test_commands_draw_a_run_whose_last_line_is_torn(capsys, tmp_path, command):
    run = _run(tmp_path, '{"step": 10, "lo')
    fig = tmp_path / "ind.svg"
    rc = main([*command, str(run), "--stat", "induction", "-o", str(fig)])
    _, err = capsys.readouterr()
    assert rc == 0 and fig.read_text().lstrip().startswith("<?xml")
    assert err.count("\n") == 1 and "warning:" in err and "line 3 is torn" in err


def test_every_line_is_flushed_and_synced_before_training_goes_on(tmp_path, monkeypatch):
    tr = Trainer.start("tiny", out=tmp_path / "run", max_steps=4, batch_size=4, eval_interval=4,
                       eval_batches=1,
                       model_overrides={"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 32})
    synced = []
    real = training.os.fsync

    def fsync(fd):
        path = tmp_path / "run" / "heads.jsonl"
        if os.path.samestat(os.fstat(fd), os.stat(path)) if path.exists() else False:
            synced.append(path.read_text().count("\n"))  # whole lines on disk at each sync
        real(fd)

    monkeypatch.setattr(training.os, "fsync", fsync)
    track_heads(tr, every=2, probe_n=4)
    assert synced == [1, 2, 3]
    assert path_lines(tmp_path) == 3


def path_lines(tmp_path) -> int:
    return len(read_heads(tmp_path / "run"))
