"""`attnlab train --lr --min-lr --warmup-steps --dropout`: checked at the boundary, used by the
schedule, recorded in the checkpoint, changeable on --resume."""

from __future__ import annotations

import json

import pytest

from attnlab import AttnlabError
from attnlab.cli import main
from attnlab.models import TrainConfig
from attnlab.models.schedule import lr_at, with_schedule

FAST = ["--batch-size", "2", "--eval-interval", "100", "--quiet", "--threads", "1"]


def _doc(out) -> dict:
    return json.loads((out / "attnlab.json").read_text())


def test_lr_flags_drive_the_schedule_and_are_recorded(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--max-steps", "3", "--lr", "1e-3",
                 "--warmup-steps", "2", "--dropout", "0.2", *FAST]) == 0
    doc = _doc(out)
    train = doc["train"]
    assert (train["lr"], train["warmup_steps"]) == (1e-3, 2)
    assert train["min_lr"] == pytest.approx(1e-4)  # the preset's min_lr / lr ratio, 0.1
    assert doc["model"]["dropout"] == 0.2
    cfg = TrainConfig.from_dict(train)
    assert [h["lr"] for h in doc["state"]["history"]] == [lr_at(s, cfg) for s in range(3)]
    assert [h["lr"] for h in doc["state"]["history"]][:2] == [5e-4, 1e-3]  # warm-up of 2

    # a resumed run takes a new schedule from here on (e.g. a lower lr after a divergence)
    assert main(["train", "--out", str(out), "--resume", "--max-steps", "4", "--lr", "5e-4",
                 "--dropout", "0", *FAST[-3:]]) == 0
    doc = _doc(out)
    assert doc["train"]["lr"] == 5e-4 and doc["train"]["min_lr"] == pytest.approx(5e-5)
    assert doc["train"]["warmup_steps"] == 2 and doc["model"]["dropout"] == 0.0
    assert doc["state"]["history"][-1]["lr"] == lr_at(3, TrainConfig.from_dict(doc["train"]))
    assert "step 4: train loss" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needles", [
    (["--lr", "0"], ["--lr: expected a finite number > 0, got 0.0"]),
    (["--lr", "nan"], ["--lr: expected a finite number > 0, got nan"]),
    (["--min-lr", "inf"], ["--min-lr: expected a finite number > 0, got inf"]),
    (["--lr", "1e-3", "--min-lr", "2e-3"], ["--min-lr: expected at most --lr 0.001, got 0.002"]),
    (["--min-lr", "1e-2"], ["min_lr: expected at most lr = 0.003", "got 0.01"]),  # tiny's lr
    (["--warmup-steps", "-1"], ["--warmup-steps: expected 0 or more, got -1"]),
    (["--dropout", "1"], ["--dropout: expected a probability in [0, 1), got 1.0"]),
])
def test_bad_schedule_flags_give_one_clear_line(tmp_path, capsys, argv, needles):
    assert main(["train", "--out", str(tmp_path / "r"), *argv, *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(n in err for n in needles), err
    assert not (tmp_path / "r" / "attnlab.json").exists()


def test_with_schedule_keeps_the_shape_and_checks_its_input():
    base = TrainConfig.from_name("tiny")
    assert with_schedule(base) == base
    cfg = with_schedule(base, lr=6e-3)
    assert (cfg.lr, cfg.min_lr, cfg.warmup_steps) == (6e-3, pytest.approx(6e-4), 30)
    cfg = with_schedule(base, min_lr=1e-4, warmup_steps=0)
    assert (cfg.lr, cfg.min_lr, cfg.warmup_steps) == (3e-3, 1e-4, 0)
    for kw, needle in [({"lr": float("inf")}, "lr: expected a finite"),
                       ({"lr": True}, "lr: expected a finite"),
                       ({"warmup_steps": 1.5}, "warmup_steps: expected an integer >= 0"),
                       ({"lr": 1e-3, "min_lr": 1e-2}, "min_lr: expected at most lr = 0.001")]:
        with pytest.raises(AttnlabError, match=needle):
            with_schedule(base, **kw)
