"""atomic_write and save_checkpoint under failure: a write or rename that fails part-way leaves
the previous file byte for byte, and the previous checkpoint loadable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from attnlab import AttnlabError
from attnlab.models import GPT, CharTokenizer, GPTConfig, load_checkpoint, save_checkpoint
from attnlab.models.checkpoint import atomic_write, check_writable, read_checkpoint

OLD = b"the previous contents\n" * 50


def _fail(*_a, **_k):
    raise OSError(28, "No space left on device")


def _snapshot(d):
    return {p.name: p.read_bytes() for p in d.iterdir()}


@pytest.mark.parametrize("broken", ["replace", "fsync"])
def test_a_failed_write_leaves_the_old_file_byte_identical(tmp_path, monkeypatch, broken):
    target = tmp_path / "attnlab.json"
    target.write_bytes(OLD)
    monkeypatch.setattr(os, broken, _fail)
    with pytest.raises(OSError):
        atomic_write(target, b"new and different")
    monkeypatch.undo()
    assert target.read_bytes() == OLD
    assert [p.name for p in tmp_path.iterdir()] == ["attnlab.json"]  # no temp file left


def test_readers_never_see_a_partial_file(tmp_path, monkeypatch):
    # at the moment of the rename the new bytes are complete in another file, the target untouched
    target = tmp_path / "x.bin"
    target.write_bytes(OLD)
    seen = {}
    real = os.replace

    def watch(src, dst):
        seen["target"], seen["temp"] = target.read_bytes(), Path(src).read_bytes()
        seen["same"] = os.path.abspath(src) == os.path.abspath(dst)
        real(src, dst)

    monkeypatch.setattr(os, "replace", watch)
    atomic_write(target, b"new")
    assert seen == {"target": OLD, "temp": b"new", "same": False}
    assert target.read_bytes() == b"new"


def _model(seed):
    torch.manual_seed(seed)
    tok = CharTokenizer.from_text("abcdefgh \n")
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2, n_kv_head=2,
                    n_embd=16)
    return GPT(cfg), tok


def test_a_save_failing_at_its_commit_point_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    old, tok = _model(0)
    save_checkpoint(tmp_path, old, tok, state={"step": 1, "history": []})
    before = _snapshot(tmp_path)
    real = os.replace

    def replace(src, dst):
        if os.path.basename(dst) == "attnlab.json":
            _fail()
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    new, _ = _model(1)
    with pytest.raises((OSError, AttnlabError)):
        save_checkpoint(tmp_path, new, tok, state={"step": 2, "history": []})
    monkeypatch.undo()
    after = _snapshot(tmp_path)
    for name, data in before.items():
        assert after.get(name) == data, f"{name} changed"
    loaded, _ = load_checkpoint(tmp_path)
    for k, v in old.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_a_save_creates_missing_directories_and_a_default_state(tmp_path):
    model, tok = _model(0)
    where = tmp_path / "runs" / "a" / "ck"
    save_checkpoint(where, model, tok)
    ck = read_checkpoint(where)
    assert ck.step == 0 and ck.doc["state"] == {"step": 0, "history": []}


def test_a_diverged_model_never_replaces_a_good_checkpoint(tmp_path):
    model, tok = _model(0)
    save_checkpoint(tmp_path, model, tok, state={"step": 1, "history": []})
    before = _snapshot(tmp_path)
    with torch.no_grad():
        model.wte.weight[0] = float("nan")  # one row of 16
    with pytest.raises(AttnlabError, match=r"refusing to save to .*: model tensor 'wte.weight' "
                                           r"holds 16 NaN/Inf .*; the previous checkpoint is kept"):
        save_checkpoint(tmp_path, model, tok, state={"step": 2, "history": []})
    assert _snapshot(tmp_path) == before


def test_check_writable_creates_the_directory_and_leaves_it_empty(tmp_path):
    where = tmp_path / "x" / "y"
    assert check_writable(where) == where
    assert where.is_dir() and list(where.iterdir()) == []
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(AttnlabError, match=rf"--out: cannot write checkpoints to "
                                           rf"'{blocked / 'ck'}' \(\w"):
        check_writable(blocked / "ck", "--out")
