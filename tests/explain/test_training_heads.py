"""Heads tracked while a GPT trains: heads.jsonl lines, and `attnlab track-heads` (kept tiny)."""

from __future__ import annotations

import json
import math
import re

import matplotlib  # noqa: F401  (the viz extra: missing, these tests fail, never skip)
import pytest
import torch

from attnlab import AttnlabError
from attnlab.cli import main
from attnlab.explain.head_statistics import STATS
from attnlab.explain.training import copy_losses, probe_ids, read_heads, track_heads
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


def test_lines_carry_the_probe_copies_losses_and_the_step_of_their_validation(tmp_path):
    tr = Trainer.start("tiny", out=tmp_path / "run", model_overrides=SMALL, max_steps=8,
                       batch_size=4, eval_interval=4, eval_batches=1)
    track_heads(tr, every=2, probe_n=8)
    lines = read_heads(tmp_path / "run")
    assert [(d["step"], d["val_step"]) for d in lines] == [(0, None), (2, None), (4, 4), (6, 4),
                                                           (8, 8)]
    assert lines[3]["val_loss"] == lines[2]["val_loss"] == tr.val_history[0]["val_loss"]
    for d in lines:
        assert math.isfinite(d["first_copy_loss"]) and d["first_copy_loss"] > 0
        assert math.isfinite(d["second_copy_loss"]) and d["second_copy_loss"] > 0
    # at step 0 every prediction is close to uniform: both copies cost about ln(vocab)
    vocab = tr.model.config.vocab_size
    assert lines[0]["first_copy_loss"] == pytest.approx(math.log(vocab), abs=0.1)
    assert lines[0]["second_copy_loss"] == pytest.approx(math.log(vocab), abs=0.1)


class _Copier(torch.nn.Module):
    """Logits for a known probe: uniform on the first copy, sure of the right token on the second
    copy (an ideal induction circuit), and sure of a wrong one where the second copy begins."""

    def __init__(self, ids, vocab):
        super().__init__()
        self.ids, self.vocab = ids, vocab

    def forward(self, idx):
        n = len(self.ids) // 2
        logits = torch.zeros(1, idx.shape[1], self.vocab)
        for t in range(n, idx.shape[1]):
            logits[0, t, self.ids[t + 1]] = 50.0
        logits[0, n - 1, (self.ids[n] + 1) % self.vocab] = 50.0
        return logits, None


def test_copy_losses_score_each_copy_after_its_first_token():
    ids = probe_ids(11, 5, seed=2)
    model = _Copier(ids, 11).train()
    first, second = copy_losses(model, ids)
    assert first == pytest.approx(math.log(11)) and second == pytest.approx(0.0, abs=1e-6)
    assert model.training  # left as it was
    with pytest.raises(AttnlabError, match="ids: expected N >= 2 tokens then the same N"):
        copy_losses(model, [1, 2, 3, 1, 2, 4])
    with pytest.raises(AttnlabError, match="ids: expected N >= 2"):
        copy_losses(model, [1, 1])


def test_probe_ids_repeat_and_are_seeded():
    ids = probe_ids(65, 10, seed=4)
    assert ids[:10] == ids[10:] and len(set(ids[:10])) == 10 and ids == probe_ids(65, 10, 4)


def test_track_heads_checks_its_arguments(tmp_path):
    tr = Trainer.start("tiny", out=tmp_path / "r", model_overrides=SMALL, max_steps=2)
    with pytest.raises(AttnlabError, match="probe_n"):
        track_heads(tr, probe_n=17)
    with pytest.raises(AttnlabError, match="every"):
        track_heads(tr, every=0)
    with pytest.raises(AttnlabError, match=r"probe_n: expected 2 or more"):
        track_heads(tr, probe_n=1)
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
    assert re.search(r"probe loss \d+\.\d\d on the first copy, \d+\.\d\d on the second", text)
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
