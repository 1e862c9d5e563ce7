"""`attnlab ablate` / `attnlab patch` and the HeadEffects record behind them: every head's effect
equals a run with that head edited alone; JSON and the page carry the same numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnlab.cli import main
from attnlab.explain.effects import ablation_effects, patch_effects
from attnlab.explain.model import load_model
from attnlab.interventions import Ablate, Patch, intervene, record_heads
from attnlab.interventions.measures import text_loss
from attnlab.viz.effects_page import effects_html
from interventions import models

TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory):
    return models.tiny_checkpoint(tmp_path_factory.mktemp("gpt") / "run")


def test_ablate_effects_equal_single_runs_on_a_causal_model(gpt_dir):
    loaded = load_model(gpt_dir)
    fx = ablation_effects("the cat sat on the mat", loaded, token="mat")
    model, tok = loaded.model, loaded.tokenizer
    ids = torch.tensor([tok.encode("the cat sat on the mat")])
    p = fx.position
    with torch.no_grad(), intervene(model, Ablate(1, 2)):
        lp = model(ids)[0][0, p - 1].double().log_softmax(-1)[ids[0, p]].item()
    assert fx.values[1, 2] == pytest.approx(lp, abs=1e-5)
    assert fx.effect[1, 2] == pytest.approx(lp - fx.baseline, abs=1e-5)
    assert fx.lens is not None and len(fx.lens["top"]) == 3  # embeddings + 2 layers
    loss = ablation_effects("the cat sat on the mat", loaded, measure="loss", lens=False)
    assert np.isfinite(loss.effect).all() and loss.position is None


def test_patch_effects_are_shares_of_the_gap(gpt_dir):
    loaded = load_model(gpt_dir)
    fx = patch_effects("the cat sat", "the mat sat", loaded)
    model, tok = loaded.model, loaded.tokenizer
    clean, corrupt = (torch.tensor([tok.encode(t)]) for t in ("the cat sat", "the mat sat"))
    with torch.no_grad(), record_heads(model) as rec:
        logits = model(clean)[0]
    top = int(logits[0, -1].argmax())
    with torch.no_grad(), intervene(model, Patch(0, 1, rec)):
        lp = model(corrupt)[0][0, -1].double().log_softmax(-1)[top].item()
    share = (lp - fx.baseline) / (fx.clean - fx.baseline)
    assert fx.effect[0, 1] == pytest.approx(share, abs=1e-4)


def test_cli_ablate_json_and_page_on_minilm(tmp_path, capsys, minilm):
    out = tmp_path / "fx.html"
    assert main(["ablate", TEXT, "--token", "it", "--json", "-o", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    effect = np.array(doc["effect"])
    assert effect.shape == (6, 12) and doc["measure"] == "cosine" and doc["lens"] is None
    assert (effect <= 1e-6).all() and effect.min() < -0.05  # cosines only fall
    page = out.read_text()
    assert "effects-data" in page and "connect-src &#x27;none&#x27;" in page
    assert main(["ablate", TEXT, "--token", "it", "--top", "2"]) == 0
    text = capsys.readouterr().out
    assert "layer 5 head 11" in text and "redundancy" in text


def test_cli_patch_and_its_errors(capsys, minilm):
    assert main(["patch", "The cat sat on the mat.", "The dog sat on the mat.", "--token",
                 "sat", "--top", "1"]) == 0
    assert "share of the clean - corrupt gap" in capsys.readouterr().out
    assert main(["patch", "The cat sat.", "The big dog sat.", "--token", "sat"]) == 2
    assert "as many tokens" in capsys.readouterr().err
    assert main(["ablate", TEXT, "--measure", "loss"]) == 2
    assert "cosine, similarity" in capsys.readouterr().err


def test_the_page_escapes_text(gpt_dir):
    loaded = load_model(gpt_dir)
    fx = ablation_effects("<b>it</b> & so", loaded, lens=True)
    page = effects_html(fx)
    assert "<b>it</b>" not in page.split("<body")[1]  # only inside the JSON, as \u003c


def test_a_local_hf_causal_lm_gets_its_head_the_measures_and_the_lens(tmp_path):
    from attnlab.explain.subject import subject

    loaded = load_model(models.gpt2_dir(tmp_path / "gpt2"))
    s = subject(loaded)
    assert s.causal and loaded.kind == "hf"
    fx = ablation_effects("the cat sat on the mat", loaded, token="mat")
    inputs, ids, _ = s.encode("the cat sat on the mat")
    with torch.no_grad(), intervene(s.model, Ablate(2, 1)):
        logits = s.forward(inputs)
    lp = logits[0, fx.position - 1].double().log_softmax(-1)[ids[fx.position]].item()
    assert fx.values[2, 1] == pytest.approx(lp, abs=1e-5)
    assert len(fx.lens["top"]) == 4 and fx.lens["tokens"] == fx.tokens
    diff = ablation_effects("the cat sat on the", loaded, measure="logit-diff",
                            answers=["mat", "dog"], lens=False)
    assert diff.effect.shape == (3, 4) and np.isfinite(diff.effect).all()
    pt = patch_effects("the cat sat on the", "the dog sat on the", loaded, answers=["mat", "dog"])
    assert pt.kind == "patch" and np.isfinite(pt.effect).all()


def test_mean_ablation_effects_use_the_references_mean(gpt_dir):
    from attnlab.interventions import HeadOutputs, MeanAblate

    loaded = load_model(gpt_dir)
    refs = ["on the mat it was", "so tired the cat"]
    fx = ablation_effects("the cat sat", loaded, measure="loss", mean_of=refs, lens=False)
    model, tok = loaded.model, loaded.tokenizer
    runs = []
    for t in refs:
        with torch.no_grad(), record_heads(model) as rec:
            model(torch.tensor([tok.encode(t)]))
        runs.append(rec)
    ids = torch.tensor([tok.encode("the cat sat")])
    with torch.no_grad(), intervene(model, MeanAblate(1, 3, HeadOutputs.average(runs))):
        loss = text_loss(model(ids)[0], ids[0]).item()
    assert fx.how == "mean" and fx.values[1, 3] == pytest.approx(loss, abs=1e-5)
