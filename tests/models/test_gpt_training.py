"""GPT and Trainer: one batch overfits, the schedule, resuming reproduces the loss curve."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from attnlab import AttnlabError
from attnlab.models import GPT, GPTConfig, TrainConfig, Trainer, lr_at
from attnlab.models.batches import TokenData, batch

SMALL = {"n_layer": 1, "n_embd": 32, "n_head": 2, "block_size": 32}


def test_one_batch_overfits():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=2, n_embd=32))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 20, (4, 16), generator=g)
    y = torch.randint(0, 20, (4, 16), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(150):
        _, loss = model(x, y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 2.5  # about ln(20) = 3.0 at the start
    assert loss.item() < 0.1, f"loss {first:.3f} -> {loss.item():.3f}: did not memorise one batch"


def test_schedule_warms_up_then_decays_to_min_lr():
    cfg = TrainConfig(max_steps=100, lr=1.0, min_lr=0.1, warmup_steps=10)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a < b for a, b in itertools.pairwise(lrs[:10]))
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))
    assert lr_at(100, cfg) == pytest.approx(0.1)
    assert lr_at(55, cfg) == pytest.approx(0.55)  # half-way through the cosine


def test_batches_depend_only_on_seed_and_step():
    data = torch.arange(1000)
    a = batch(data, 4, 8, seed=1, index=7)
    b = batch(data, 4, 8, seed=1, index=7)
    c = batch(data, 4, 8, seed=1, index=8)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])
    assert torch.equal(a[1], a[0] + 1)  # targets are the next tokens


def test_training_lowers_validation_loss():
    t = Trainer.start("tiny", model_overrides=SMALL, max_steps=30, batch_size=8,
                      eval_interval=15, eval_batches=2)
    t.run()
    first, last = t.val_history[0]["val_loss"], t.val_history[-1]["val_loss"]
    assert last < first < math.log(t.tokenizer.vocab_size) + 0.5
    assert [h["step"] for h in t.val_history] == [15, 30]


def test_resume_gives_the_same_loss_curve(tmp_path):
    # dropout on, so resuming must also restore the RNG, not just weights and AdamW moments
    kw = {"model_overrides": {**SMALL, "dropout": 0.1}, "max_steps": 8, "batch_size": 4,
          "eval_interval": 4, "eval_batches": 2, "warmup_steps": 3}
    whole = Trainer.start("tiny", **kw)
    whole.run()
    part = Trainer.start("tiny", out=tmp_path / "run", **kw)
    part.run(stop_after=3)  # "interrupted" after step 3
    resumed = Trainer.resume(tmp_path / "run")
    assert resumed.step == 3
    resumed.run()
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in whole.history]
    assert resumed.val_history == whole.val_history
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_resume_can_extend_the_run(tmp_path):
    kw = {"model_overrides": SMALL, "max_steps": 2, "batch_size": 2, "eval_batches": 1}
    Trainer.start("tiny", out=tmp_path, **kw).run()
    t = Trainer.resume(tmp_path, max_steps=4)
    t.run()
    assert t.step == 4 and len(t.history) == 4 and t.val_history[-1]["step"] == 4


def test_config_presets_and_derived_fields():
    cfg = GPTConfig.from_name("tiny-gqa", vocab_size=50)
    assert cfg.head_dim == cfg.n_embd // cfg.n_head and cfg.n_kv_head < cfg.n_head
    assert GPTConfig(n_head=4).n_kv_head == 4
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(AttnlabError, match="preset: unknown 'huge'"):
        GPTConfig.from_name("huge")
    with pytest.raises(AttnlabError, match="n_embd 30 is not divisible by n_head 4"):
        GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(AttnlabError, match="min_lr"):
        TrainConfig(lr=1e-3, min_lr=1e-2)
    with pytest.raises(AttnlabError, match=r"train config: unknown fields \['lr_max'\]"):
        TrainConfig.from_name("tiny", lr_max=1.0)


def test_split_refuses_a_corpus_too_short_for_the_block():
    with pytest.raises(AttnlabError, match="val split has"):
        TokenData.split(list(range(100)), 0.1, block_size=32)


def test_progress_bar_shows_loss_and_tokens_per_second(capsys):
    t = Trainer.start("tiny", model_overrides=SMALL, max_steps=3, batch_size=2, eval_interval=2,
                      eval_batches=1, progress=True)
    t.run()
    err = capsys.readouterr().err
    assert "3/3" in err and "loss=" in err and "tok/s=" in err and "val=" in err


def test_model_code_stays_free_of_distributed_hf_and_plotting_imports():
    import ast
    from pathlib import Path

    import attnlab.models
    import attnlab.nn

    banned = ("torch.distributed", "transformers", "matplotlib")
    # the process layout and the launcher join groups; the model is only handed a handle
    runtime = {"parallel.py", "launch.py"}
    for pkg in (attnlab.nn, attnlab.models):
        for path in Path(pkg.__file__).parent.glob("*.py"):
            ban = banned[1:] if pkg is attnlab.models and path.name in runtime else banned
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                assert not [n for n in names if n.startswith(ban)], f"{path.name}: {names}"
