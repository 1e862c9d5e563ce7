"""Heads tracked while a GPT trains: heads.jsonl lines, and `attnlab track-heads` (kept tiny)."""

from __future__ import annotations

import json

import matplotlib  # noqa: F401  (the viz extra: missing, these tests fail, never skip)
import pytest

from attnlab import AttnlabError
from attnlab.cli import main
from attnlab.explain.head_names import STATS
from attnlab.explain.training import probe_ids, read_heads, track_heads
from attnlab.models import Trainer

SMALL = {"n_layer": 2, "n_head": 2, "n_embd": 16, "block_size": 32}


def test_track_heads_writes_a_line_per_evaluation(tmp_path):
    tr = Trainer.start("tiny", out=tmp_path / "run", model_overrides=SMALL, max_steps=6,
                       batch_size=4, eval_interval=6, eval_batches=1)
    path = track_heads(tr, every=3, probe_n=8)
    lines = read_heads(tmp_path / "run")
    assert path == tmp_path / "run" / "heads.jsonl"
    assert [d["step"] for d in lines] == [0, 3, 6]
    assert lines[0]["loss"] is None and all(d["loss"] > 0 for d in lines[1:])
    assert lines[-1]["val_loss"] is not None
    for d in lines:
        assert list(d["stats"]) == list(STATS) and len(d["stats"]["induction"]) == 2
        assert all(v is not None for row in d["stats"]["induction"] for v in row)


def test_probe_ids_repeat_and_are_seeded():
    ids = probe_ids(65, 10, seed=4)
    assert ids[:10] == ids[10:] and len(set(ids[:10])) == 10 and ids == probe_ids(65, 10, 4)


def test_track_heads_checks_its_arguments(tmp_path):
    tr = Trainer.start("tiny", out=tmp_path / "r", model_overrides=SMALL, max_steps=2)
    with pytest.raises(AttnlabError, match="probe_n"):
        track_heads(tr, probe_n=17)
    with pytest.raises(AttnlabError, match="every"):
        track_heads(tr, every=0)
    with pytest.raises(AttnlabError, match=r"no heads\.jsonl"):
        read_heads(tmp_path)


def test_track_heads_command(tmp_path, capsys, monkeypatch):
    from attnlab.models import PRESETS

    preset = PRESETS["induction"]
    monkeypatch.setitem(preset, "model", {**preset["model"], **SMALL})
    monkeypatch.setitem(preset, "train", {**preset["train"], "batch_size": 4, "eval_batches": 1})
    out, fig = tmp_path / "run", tmp_path / "ind.png"
    rc = main(["track-heads", "--out", str(out), "--max-steps", "4", "--every", "2", "--probe",
               "8", "-o", str(fig)])
    text, err = capsys.readouterr()
    assert rc == 0 and err == "" and "largest induction score" in text
    assert "at step 0" in text and "s training" in text
    assert fig.read_bytes()[:4] == b"\x89PNG"
    assert [json.loads(x)["step"] for x in (out / "heads.jsonl").read_text().splitlines()] == [
        0, 2, 4]
    svg = tmp_path / "prev.svg"
    assert main(["track-heads", "--out", str(out), "--plot-only", "--stat", "prev",
                 "-o", str(svg)]) == 0
    assert svg.is_file()
    assert main(["track-heads", "--plot-only", "--stat", "nope", "-o", str(svg)]) == 2


def test_train_track_heads_flag(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", "--out", str(out), "--max-steps", "4", "--eval-interval", "2",
               "--batch-size", "4", "--quiet", "--track-heads"])
    capsys.readouterr()
    assert rc == 0
    lines = read_heads(out)
    assert [d["step"] for d in lines] == [0, 2, 4] and list(lines[-1]["stats"]) == list(STATS)
    assert main(["train", "--out", str(tmp_path / "p"), "--nproc", "2", "--track-heads"]) == 2
    assert "--track-heads: one process only" in capsys.readouterr().err
