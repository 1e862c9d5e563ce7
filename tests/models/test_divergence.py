"""A diverging run stops before it saves: NaN/Inf in the loss or the gradients is an AttnlabError
(exit 2 from the CLI), the last good checkpoint stays byte for byte, a save refuses non-finite
tensors, and a checkpoint holding them is refused on load and on resume. Ctrl-C still saves."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from attnlab import AttnlabError
from attnlab.cli import main
from attnlab.models import Trainer, load_checkpoint, save_checkpoint
from attnlab.models.checkpoint import read_checkpoint

SMALL = {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16}
RUN = {"model_overrides": SMALL, "batch_size": 2, "eval_batches": 1, "warmup_steps": 0}


def snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def doc_of(d):
    return json.loads((d / "attnlab.json").read_text())


def test_a_diverging_run_stops_and_keeps_the_good_checkpoint(tmp_path):
    out = tmp_path / "run"
    t = Trainer.start("tiny", out=out, max_steps=8, eval_interval=2, **RUN)
    t.run(stop_after=2)
    good = snapshot(out)
    t.config.lr = t.config.min_lr = 1e6  # the next steps blow the weights up
    with pytest.raises(AttnlabError, match=r"training loss is nan at step 4 \(lr 1e\+06\): "
                                           r"training diverged") as e:
        t.run()
    assert f"{out} keeps its checkpoint of step 2" in str(e.value)
    assert snapshot(out) == good
    assert t.step == 3 and all(torch.isfinite(torch.tensor(h["loss"])) for h in t.history)
    assert read_checkpoint(out, with_trainer=True).step == 2


def test_a_run_that_diverges_before_its_first_save_says_nothing_was_saved(tmp_path):
    out = tmp_path / "run"
    t = Trainer.start("tiny", out=out, max_steps=8, eval_interval=4, lr=1e6, min_lr=1e6, **RUN)
    with pytest.raises(AttnlabError, match=f"nothing was saved to {out}"):
        t.run()
    assert not (out / "attnlab.json").exists()


def test_a_non_finite_gradient_stops_before_the_optimizer_step(tmp_path):
    t = Trainer.start("tiny", out=tmp_path, max_steps=4, **RUN)
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    t.model.lm_head.weight.register_hook(lambda g: torch.full_like(g, float("inf")))
    with pytest.raises(AttnlabError, match="gradient norm is inf at step 1"):
        t.train_step()  # the loss itself is finite
    assert t.step == 0 and t.history == [] and t.optimizer.state_dict()["state"] == {}
    for k, v in t.model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_a_non_finite_validation_loss_stops_before_saving(tmp_path, monkeypatch):
    t = Trainer.start("tiny", out=tmp_path / "run", max_steps=4, eval_interval=2, **RUN)
    monkeypatch.setattr(Trainer, "evaluate", lambda self: float("nan"))
    with pytest.raises(AttnlabError, match="validation loss is nan at step 2"):
        t.run()
    assert not (tmp_path / "run" / "attnlab.json").exists()


def test_cli_a_diverging_resume_exits_non_zero_and_keeps_the_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--max-steps", "2", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    doc = doc_of(out)
    doc["train"]["lr"] = doc["train"]["min_lr"] = 1e6
    (out / "attnlab.json").write_text(json.dumps(doc))
    good = snapshot(out)
    assert main(["train", "--max-steps", "6", "--out", str(out), "--resume", "--quiet"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()[-1]  # after the line that announces the run
    assert err.startswith("attnlab train: error: ") and "training diverged" in err, cap.err
    assert "Traceback" not in cap.err
    assert "keeps its checkpoint of step 2" in err and "saved" not in cap.out
    assert snapshot(out) == good


@pytest.mark.parametrize("kind", ["model", "trainer"])
def test_save_refuses_non_finite_tensors_and_keeps_the_previous_checkpoint(tmp_path, kind):
    t = Trainer.start("tiny", out=tmp_path, max_steps=2, **RUN)
    t.run()
    good = snapshot(tmp_path)
    if kind == "model":
        with torch.no_grad():
            t.model.ln_f.weight[3] = float("nan")
        needle = "model tensor 'ln_f.weight' holds 1 NaN/Inf of 16 values"
    else:
        t.optimizer.state[t.model.wte.weight]["exp_avg"][0, 0] = float("inf")
        needle = "trainer tensor 'adamw.0.exp_avg' holds 1 NaN/Inf"
    with pytest.raises(AttnlabError, match="refusing to save") as e:
        t.save()
    assert needle in str(e.value) and "the previous checkpoint is kept" in str(e.value)
    assert snapshot(tmp_path) == good


def _poison(ck, kind, version):
    """NaN in one tensor of `kind`, in a checkpoint that is otherwise consistent (as a run that
    diverged would have left it before saves refused NaN): hash updated, or format version 1."""
    doc = doc_of(ck)
    path = ck / doc["files"][kind]
    tensors = st_load(path.read_bytes())
    name = next(k for k, v in tensors.items() if v.is_floating_point())
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    data = st_save(tensors, metadata={"step": str(doc["state"]["step"])})
    path.write_bytes(data)
    if version == 1:
        doc["version"] = 1
        del doc["sha256"]
    else:
        doc["sha256"][kind] = hashlib.sha256(data).hexdigest()
    (ck / "attnlab.json").write_text(json.dumps(doc))
    return name


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "run"
    Trainer.start("tiny", out=out, max_steps=2, **RUN).run()
    return out


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("kind", ["model", "trainer"])
def test_a_non_finite_checkpoint_is_refused_on_resume_and_load(trained, tmp_path, capsys, kind,
                                                                version):
    ck = shutil.copytree(trained, tmp_path / "ck")
    name = _poison(ck, kind, version)
    with pytest.raises(AttnlabError, match="NaN/Inf") as e:
        Trainer.resume(ck)
    assert repr(name) in str(e.value) and "diverged" in str(e.value)
    if kind == "model":
        with pytest.raises(AttnlabError, match="NaN/Inf"):
            load_checkpoint(ck)
    assert main(["train", "--out", str(ck), "--resume", "--max-steps", "4", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "NaN/Inf" in err and "refusing to load" in err, err


def test_ctrl_c_still_saves_the_run(tmp_path, monkeypatch):
    t = Trainer.start("tiny", out=tmp_path, max_steps=8, eval_interval=100, **RUN)
    real_step = Trainer.train_step

    def step_then_ctrl_c(self):
        loss = real_step(self)
        if self.step == 3:
            signal.raise_signal(signal.SIGINT)  # handled: the step finishes, then the run saves
        return loss

    monkeypatch.setattr(Trainer, "train_step", step_then_ctrl_c)
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        t.run(handle_interrupt=True)
    assert signal.getsignal(signal.SIGINT) is handler
    assert read_checkpoint(tmp_path, with_trainer=True).step == 3
    model, _ = load_checkpoint(tmp_path)
    for k, v in t.model.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


def test_save_checkpoint_refuses_nan_weights_from_the_api(tmp_path):
    from attnlab.models import GPT, CharTokenizer, GPTConfig

    tok = CharTokenizer("ab")
    model = GPT(GPTConfig(vocab_size=2, block_size=4, n_layer=1, n_head=1, n_embd=4))
    with torch.no_grad():
        model.wte.weight.fill_(float("inf"))
    with pytest.raises(AttnlabError, match=r"model tensor 'wte\.weight' holds 8 NaN/Inf of 8"):
        save_checkpoint(tmp_path / "ck", model, tok)
    assert not (tmp_path / "ck").exists()
