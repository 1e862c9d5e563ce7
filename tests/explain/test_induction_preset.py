"""The `induction` preset: attention-only GPTs, repeated-text windows, and the probe that
`track_heads` scores induction heads on (frequent characters, a hand-built head scores 1)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import attnlab.models as models
from attnlab import AttnlabError
from attnlab.cli import main
from attnlab.explain.head_statistics import STATS
from attnlab.explain.probe import PROBE_COVERAGE, frequent_ids
from attnlab.explain.training import (
    induction_summary,
    probe_ids,
    read_heads,
    track_heads,
)
from attnlab.models import GPT, GPTConfig, TrainConfig, Trainer
from attnlab.models.checkpoint import load_checkpoint, save_checkpoint
from attnlab.models.tokenizer import CharTokenizer

FAST = {"max_steps": 4, "batch_size": 2, "eval_interval": 2, "eval_batches": 1}


def test_the_preset_is_two_attention_only_layers_on_repeated_text():
    cfg, tcfg = GPTConfig.from_name("induction"), TrainConfig.from_name("induction")
    assert (cfg.n_layer, cfg.attn_only, cfg.rotary, cfg.block_size) == (2, True, True, 128)
    assert 0 < tcfg.repeat_prob < 1 and tcfg.max_steps <= 2000
    model = GPT(GPTConfig.from_name("induction", vocab_size=73))
    names = [n for n, _ in model.named_parameters()]
    assert not any(".mlp." in n or ".ln2." in n for n in names)
    assert model.num_params() < 50_000


def test_the_preset_trains_a_few_steps(tmp_path):
    tr = Trainer.start("induction", out=tmp_path / "run", **FAST)
    tr.run()
    assert tr.step == 4 and all(np.isfinite([h["loss"] for h in tr.history]))
    model, _ = load_checkpoint(tmp_path / "run")
    assert model.config.attn_only and model.config.name == "induction"
    assert TrainConfig.from_dict(tr.config.to_dict()) == tr.config


def test_attn_only_round_trips_and_old_checkpoints_still_load(tmp_path):
    cfg = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, attn_only=True)
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg
    tok = CharTokenizer.from_text("abcdefghijk")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
    save_checkpoint(tmp_path, model, tok)
    meta = tmp_path / "attnlab.json"
    doc = json.loads(meta.read_text())
    del doc["model"]["attn_only"]  # written before the field existed
    meta.write_text(json.dumps(doc))
    loaded, _ = load_checkpoint(tmp_path)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert loaded.config.attn_only is False
    assert torch.equal(loaded(ids)[0], model.eval()(ids)[0])


def test_the_probe_draws_the_characters_the_model_trains_on():
    tr = Trainer.start("induction", max_steps=1)
    pool = frequent_ids(tr.data.train, at_least=32)
    counts = torch.bincount(tr.data.train, minlength=tr.model.config.vocab_size)
    assert counts[pool].sum() / counts.sum() >= PROBE_COVERAGE
    assert counts[pool].min() >= 100  # no digit, "&" or "Q"
    for rare in "&3Q":
        assert tr.tokenizer.encode(rare)[0] not in pool
    assert pool[:2] == tr.tokenizer.encode(" e")
    assert frequent_ids(torch.tensor([0, 0, 0, 1]), coverage=0.5) == [0]
    assert frequent_ids(torch.tensor([0, 0, 0, 1]), coverage=0.5, at_least=5) == [0, 1]
    ids = probe_ids(73, 32, 0, pool=pool)
    assert ids[:32] == ids[32:] and set(ids) <= set(pool) and len(set(ids)) == 32


def _perfect_induction(att):
    """`att` with layer 1, head 0 a perfect induction head over its tokens: each query whose
    token came before looks at the token after that earlier one; the rest look at themselves."""
    w = att.weights.copy()
    L = w.shape[-1]
    w[1, 0] = 0.0
    for i in range(L):
        earlier = [k for k in range(i) if att.tokens[k] == att.tokens[i]]
        w[1, 0, i, earlier[-1] + 1 if earlier else i] = 1.0
    att.weights = w
    return att


def test_a_hand_built_induction_head_scores_one_on_the_tracked_probe(tmp_path, monkeypatch):
    real = models.capture_attention
    seen = []

    def capture(model, ids, tokenizer=None):
        seen.append(list(ids))
        return _perfect_induction(real(model, ids, tokenizer))

    monkeypatch.setattr(models, "capture_attention", capture)
    tr = Trainer.start("induction", out=tmp_path / "run", **FAST)
    track_heads(tr, every=2, probe_n=40)
    lines = read_heads(tmp_path / "run")
    assert [d["step"] for d in lines] == [0, 2, 4] and len(seen) == 3
    assert seen[0] == seen[-1] and seen[0][:40] == seen[0][40:]
    assert set(seen[0]) <= set(frequent_ids(tr.data.train, at_least=40))
    for d in lines:
        ind = d["stats"]["induction"]
        assert ind[1][0] == pytest.approx(1.0) and d["labels"][1][0] == "induction"
        assert d["stats"]["duplicate"][1][0] == pytest.approx(0.0)
        assert max(ind[0]) < 0.2  # the untouched heads of a barely trained model: near chance
    s = induction_summary(lines)
    assert (s["head"], s["formed_step"], s["max"]) == ((1, 0), 0, pytest.approx(1.0))


def test_induction_summary():
    def line(step, ind, loss):
        return {"step": step, "loss": loss, "stats": {"induction": ind}}

    lines = [line(0, [[0.02, None]], None), line(50, [[0.1, 0.45]], 2.0),
             line(100, [[0.7, 0.5]], 1.5)]
    s = induction_summary(lines)
    assert s == {"max": 0.7, "max_step": 100, "head": (0, 0), "formed_step": 50,
                 "formed_loss": 2.0, "chance": 0.02}
    assert induction_summary(lines[:1])["formed_step"] is None
    with pytest.raises(AttnlabError, match="no induction score"):
        induction_summary([line(0, [[None]], None)])


def test_train_preset_track_heads_is_well_formed(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--preset", "induction", "--out", str(out), "--max-steps", "4",
                 "--eval-interval", "2", "--batch-size", "2", "--quiet", "--track-heads"]) == 0
    capsys.readouterr()
    lines = read_heads(out)
    assert [d["step"] for d in lines] == [0, 2, 4]
    for d in lines:
        assert list(d["stats"]) == list(STATS)
        for name in ("induction", "duplicate", "prev", "entropy_norm"):
            rows = d["stats"][name]
            assert len(rows) == 2 and all(len(r) == 4 for r in rows)
            assert all(v is not None and 0 <= v <= 1 for r in rows for v in r)
        assert len(d["labels"]) == 2 and all(len(r) == 4 for r in d["labels"])
    assert lines[0]["loss"] is None and all(d["loss"] > 0 for d in lines[1:])


def test_heads_repeat_random_on_a_checkpoint_draws_its_corpus_frequent_characters(tmp_path):
    from attnlab.explain.model import load_model
    from attnlab.explain.probe import repeat_random

    tr = Trainer.start("induction", out=tmp_path / "run", max_steps=1, batch_size=2,
                       eval_batches=1)
    tr.run()
    att = repeat_random(load_model(str(tmp_path / "run")), 40, seed=3)
    ids = [int(t) for t in att.tokens]
    assert ids[:40] == ids[40:]
    assert set(ids) <= set(frequent_ids(tr.data.train, at_least=40))


def test_the_docs_describe_the_preset_it_ships():
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs/learn/heads.md"
    section = page.read_text(encoding="utf-8").split("## Heads forming during training", 1)[1]
    section = " ".join(section.split())
    tr = Trainer.start("induction", max_steps=1)
    cfg, tcfg = tr.model.config, TrainConfig.from_name("induction")
    assert f"({tr.model.num_params():,} parameters)" in section
    assert f"{tcfg.max_steps:,} steps of {tcfg.batch_size} windows" in section
    def sci(x):
        return f"{x:.0e}".replace("e-0", "e-")  # 1e-2

    assert f"lr {sci(tcfg.lr)} ({tcfg.warmup_steps} warm-up steps, cosine to " \
        f"{sci(tcfg.min_lr)})" in section
    assert f"repeat_prob={tcfg.repeat_prob}" in section
    assert f"{cfg.n_head} heads, {cfg.n_embd} wide, rotary positions, {cfg.block_size} " \
        "characters of context" in section
    pool = frequent_ids(tr.data.train, at_least=32)
    assert f"the {len(pool)} that make up {round(100 * PROBE_COVERAGE)}% of the corpus" in section
    assert "(../img/induction-training.png)" in section
    assert (Path(__file__).resolve().parents[2] / "docs/img/induction-training.png").is_file()


@pytest.mark.slow
def test_an_induction_head_starts_forming_in_a_short_run(tmp_path):
    # every window repeated and the learning rate held at 1e-2: the preset's data at its
    # strongest, 350 steps (about 11 s of one CPU core) instead of 1,500
    tr = Trainer.start("induction", out=tmp_path / "run", max_steps=350, repeat_prob=1.0,
                       min_lr=1e-2, warmup_steps=50, eval_interval=350, eval_batches=1)
    lines = read_heads(track_heads(tr, every=50))
    s = induction_summary(lines)
    assert s["chance"] < 0.04
    assert s["max"] > 0.1 and s["head"][0] == 1 and s["max_step"] >= 250
    assert lines[-1]["loss"] < lines[1]["loss"] - 0.5
