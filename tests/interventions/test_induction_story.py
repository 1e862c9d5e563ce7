"""The induction story's mechanics on a small random checkpoint (the trained story is generated on
the docs' Learn page): its rows are the losses of the runs they name, and `cached_run` trains a
run once."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab import AttnlabError
from attnlab.cli import main
from attnlab.explain.induction import induction_story
from attnlab.explain.model import load_model
from attnlab.interventions import Ablate, intervene
from attnlab.interventions.measures import text_loss
from attnlab.models.cached_run import cached_run
from interventions import models


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_model(models.tiny_checkpoint(tmp_path_factory.mktemp("gpt") / "run"))


def test_the_rows_are_the_losses_of_the_runs_they_name(loaded):
    story = induction_story(loaded, 12, seed=1)  # its top head is in layer 1: a prev head below
    ids = torch.tensor([story.ids])
    assert story.ids[:12] == story.ids[12:] and len(story.ids) == 24
    with torch.no_grad(), intervene(loaded.model, Ablate(*story.induction)):
        logits = loaded.model(ids)[0]
    what, first, second = story.rows[1]
    assert "zero-ablated" in what and f"layer {story.induction[0]}" in what
    assert first == pytest.approx(text_loss(logits, ids[0], 1, 12).item(), abs=1e-6)
    assert second == pytest.approx(text_loss(logits, ids[0], 13, 24).item(), abs=1e-6)
    assert story.second[story.induction] == pytest.approx(second - story.rows[0][2], abs=1e-5)
    assert story.prev is not None and story.prev[0] < story.induction[0]
    assert any("patched back" in w for w, _, _ in story.rows)


def test_cli_story_and_its_errors(loaded, capsys):
    assert main(["ablate", "--model", loaded.path, "--repeat-random", "10", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n"] == 10 and doc["rows"][0]["what"] == "as trained"
    assert main(["ablate", "--model", loaded.path, "--repeat-random", "40"]) == 2
    assert "two copies" in capsys.readouterr().err
    assert main(["ablate", "some text", "--model", loaded.path, "--repeat-random", "5"]) == 2
    with pytest.raises(AttnlabError, match="attnlab trained"):
        induction_story(load_model(None), 5)


def test_cached_run_trains_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_RUNS", str(tmp_path))
    kw = {"batch_size": 2, "eval_interval": 2, "eval_batches": 1}
    path = cached_run("tiny", max_steps=2, **kw)
    files = sorted(p.name for p in path.iterdir())
    assert cached_run("tiny", max_steps=2, **kw) == path
    assert sorted(p.name for p in path.iterdir()) == files  # read, not trained again
    assert cached_run("tiny", max_steps=2, seed=1, **kw) != path
