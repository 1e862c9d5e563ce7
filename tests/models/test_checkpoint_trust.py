"""A checkpoint directory is untrusted input: every damaged, foreign or hostile part of it is one
AttnlabError naming the file and the fault (one line, exit 2 from the CLI), never a traceback, a
read outside the directory, or weights loaded from bytes that changed."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from attnlab import AttnlabError
from attnlab.cli import main
from attnlab.explain.model import load_model
from attnlab.models import Trainer, is_checkpoint, load_checkpoint, save_checkpoint
from attnlab.models.checkpoint import read_checkpoint

SMALL = {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16}
RUN = {"model_overrides": SMALL, "max_steps": 2, "batch_size": 2, "eval_batches": 1}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A checkpoint of a 2-step run, with trainer state (made once; tests copy it)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    Trainer.start("tiny", out=out, **RUN).run()
    return out


@pytest.fixture
def ck(trained, tmp_path):
    return shutil.copytree(trained, tmp_path / "ck")


def doc_of(ck):
    return json.loads((ck / "attnlab.json").read_text())


def write_doc(ck, doc):
    (ck / "attnlab.json").write_text(json.dumps(doc))


def tensor_file(ck, kind="model"):
    return ck / doc_of(ck)["files"][kind]


def rewrite_tensors(ck, kind, change):
    """Replace the tensors of `kind` by change(tensors), keeping step metadata and the hash right,
    so that only the tensors themselves are wrong."""
    path = tensor_file(ck, kind)
    tensors = change(st_load(path.read_bytes()))
    data = st_save(tensors, metadata={"step": str(doc_of(ck)["state"]["step"])})
    path.write_bytes(data)
    doc = doc_of(ck)
    doc["sha256"][kind] = hashlib.sha256(data).hexdigest()
    write_doc(ck, doc)


def as_legacy(ck):
    """The format attnlab wrote before hashes: version 1, no "sha256"."""
    doc = doc_of(ck)
    doc["version"] = 1
    del doc["sha256"]
    write_doc(ck, doc)


def cli_one_line_error(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


# -- names in attnlab.json -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../../../etc/passwd", "/etc/passwd",
                                  "../other/model.safetensors", "sub/model.safetensors",
                                  ".hidden.safetensors", "attnlab.json", "", 7, None])
def test_file_names_must_be_plain_names_inside_the_directory(ck, name):
    other = ck.parent / "other"
    other.mkdir()
    shutil.copy(tensor_file(ck), other / "model.safetensors")  # a valid file, one level up
    doc = doc_of(ck)
    doc["files"]["model"] = name
    write_doc(ck, doc)
    label = "'files.model'"
    with pytest.raises(AttnlabError, match=label) as e:
        load_checkpoint(ck)
    assert "attnlab.json" in str(e.value)
    assert not is_checkpoint(ck)
    doc["files"]["model"], doc["files"]["trainer"] = "model.safetensors", name or "../x"
    write_doc(ck, doc)
    with pytest.raises(AttnlabError, match=r"'files\.trainer'"):
        read_checkpoint(ck, with_trainer=True)


def test_a_link_out_of_the_directory_is_refused(ck, tmp_path):
    outside = tmp_path / "outside.safetensors"
    shutil.move(tensor_file(ck), outside)
    tensor_file(ck).symlink_to(outside)
    with pytest.raises(AttnlabError, match="outside the checkpoint directory"):
        load_checkpoint(ck)


# -- the tensor files ------------------------------------------------------------------------


def test_save_records_the_sha256_of_each_tensor_file(ck):
    doc = doc_of(ck)
    assert doc["version"] == 2 and set(doc["sha256"]) == {"model", "trainer"}
    for kind in ("model", "trainer"):
        assert doc["sha256"][kind] == hashlib.sha256(tensor_file(ck, kind).read_bytes()).hexdigest()


@pytest.mark.parametrize("kind", ["model", "trainer"])
def test_a_flipped_byte_is_caught_not_loaded(ck, kind):
    path = tensor_file(ck, kind)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # inside the last tensor's values: still a valid safetensors file
    path.write_bytes(bytes(data))
    st_load(bytes(data))  # parses fine: only the hash can tell
    with pytest.raises(AttnlabError, match="does not match the SHA-256") as e:
        read_checkpoint(ck, with_trainer=True)
    assert path.name in str(e.value)


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage"])
@pytest.mark.parametrize("legacy", [False, True])
def test_damaged_tensor_files_are_one_clear_error(ck, damage, legacy):
    if legacy:
        as_legacy(ck)
    path = tensor_file(ck)
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "truncated": data[: len(data) // 2],
                      "garbage": b"\xff" * 8 + os.urandom(200)}[damage])
    expected = ("empty|not a readable safetensors" if legacy else "does not match the SHA-256")
    with pytest.raises(AttnlabError, match=expected) as e:
        load_checkpoint(ck)
    assert path.name in str(e.value)


def test_wrong_shaped_and_missing_tensors(ck):
    rewrite_tensors(ck, "model", lambda t: {**t, "wte.weight": torch.zeros(3, 5)})
    with pytest.raises(AttnlabError, match=r"'wte.weight' has shape \(3, 5\), the model config "
                                           r"needs \(\d+, 16\)"):
        load_checkpoint(ck)
    rewrite_tensors(ck, "model", lambda t: {k: v for k, v in t.items() if k != "ln_f.bias"})
    with pytest.raises(AttnlabError, match=r"missing \['ln_f.bias'\]"):
        load_checkpoint(ck)


def test_a_config_claiming_a_huge_model_allocates_nothing(ck):
    doc = doc_of(ck)
    doc["model"]["n_layer"] = 7
    write_doc(ck, doc)
    with pytest.raises(AttnlabError, match=r"holds 1 layers but attnlab\.json says n_layer"):
        load_checkpoint(ck)
    doc["model"]["n_layer"], doc["model"]["n_embd"] = 1, 2**13
    write_doc(ck, doc)
    with pytest.raises(AttnlabError, match="the model config needs"):
        load_checkpoint(ck)


# -- attnlab.json ----------------------------------------------------------------------------


@pytest.mark.parametrize("path, value, needle", [
    (("files",), None, "missing 'files'"),
    (("files", "model"), None, "missing 'files.model'"),
    (("state",), None, "missing 'state'"),
    (("state", "step"), None, "missing 'state.step'"),
    (("model",), None, "missing 'model'"),
    (("tokenizer",), None, "missing 'tokenizer'"),
    (("sha256",), None, "missing 'sha256'"),
    (("sha256", "model"), None, "'sha256.model' must be the 64-digit SHA-256"),
    (("state", "step"), "3", "'state.step' must be a JSON integer"),
    (("state", "step"), -1, "'state.step' must be a step number >= 0"),
    (("model",), [1, 2], "'model' must be a JSON object"),
    (("model", "n_head"), "two", "'model' is not valid"),
    (("model", "n_layer"), None, "'model' is not valid"),
    (("model", "depth"), 3, "'model' is not valid (model config: unknown fields ['depth'])"),
    (("tokenizer", "chars"), None, "'tokenizer' is not valid"),
    (("tokenizer", "chars"), ["a", "b"], "'tokenizer' is not valid"),
    (("tokenizer", "chars"), "".join(chr(0x100 + i) for i in range(500)),
     "the tokenizer has 500 symbols but the model's vocab_size is"),
    (("version",), 99, "format version 99"),
    (("format",), "other", "format 'other'"),
])
def test_a_bad_attnlab_json_names_the_field(ck, path, value, needle):
    doc = doc_of(ck)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is None and path[-1] != "n_layer":
        del node[path[-1]]
    else:
        node[path[-1]] = value
    write_doc(ck, doc)
    with pytest.raises(AttnlabError) as e:
        load_checkpoint(ck)
    assert needle in str(e.value) and "attnlab.json" in str(e.value), str(e.value)


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]", "\xff\xfe"])
def test_an_unreadable_attnlab_json_is_one_clear_error(ck, text):
    (ck / "attnlab.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(AttnlabError, match=r"attnlab\.json: expected a JSON object|not valid JSON"):
        load_checkpoint(ck)


@pytest.mark.parametrize("key, value", [("history", None), ("val", "x"), ("tokens_seen", None),
                                        ("elapsed_s", "1 s"), ("history", [1]), ("val", ["x"]),
                                        ("val", [{"step": 1}]),
                                        ("history", [{"step": 1, "loss": "low"}])])
def test_resume_checks_the_training_state(ck, key, value):
    doc = doc_of(ck)
    doc["state"][key] = value
    write_doc(ck, doc)
    with pytest.raises(AttnlabError, match=rf"'state\.{key}(\[0\])?'"):
        Trainer.resume(ck)
    doc["train"]["lr"] = "fast"
    write_doc(ck, doc)
    with pytest.raises(AttnlabError, match="'train' is not valid"):
        Trainer.resume(ck)


# -- the optimizer state -----------------------------------------------------------------------


@pytest.mark.parametrize("change, needle", [
    (lambda t: {**t, "adamw.0.exp_avg": torch.zeros(2, 2)}, "'adamw.0.exp_avg' is torch.float32 "
     "(2, 2), parameter 0 needs a float tensor of shape"),
    (lambda t: {k: v for k, v in t.items() if k != "adamw.3.exp_avg_sq"},
     "AdamW state of parameter 3 is incomplete"),
    (lambda t: {**t, "adamw.999.step": torch.tensor(1.0)}, "unexpected tensor 'adamw.999.step'"),
    (lambda t: {**t, "adamw.0.momentum": torch.tensor(1.0)},
     "unexpected tensor 'adamw.0.momentum'"),
    (lambda t: {k: v for k, v in t.items() if k != "rng.torch"}, "'rng.torch' must be the torch "
     "RNG state"),
    (lambda t: {**t, "rng.torch": torch.zeros(3, dtype=torch.uint8)}, "'rng.torch' must be"),
])
def test_a_bad_optimizer_state_names_the_file_and_tensor(ck, change, needle):
    rewrite_tensors(ck, "trainer", change)
    with pytest.raises(AttnlabError) as e:
        Trainer.resume(ck)
    assert needle in str(e.value) and tensor_file(ck, "trainer").name in str(e.value), str(e.value)


# -- the CLI: one line, exit 2 -------------------------------------------------------------------


def test_cli_reports_damaged_checkpoints_in_one_line(ck, capsys):
    tensor_file(ck).write_bytes(b"\x00" * 40)
    for argv in (["generate", "--model", str(ck), "--prompt", "a"],
                 ["train", "--out", str(ck), "--resume", "--quiet"],
                 ["explain", "a", "--token", "a", "--model", str(ck)]):
        cli_one_line_error(capsys, argv, tensor_file(ck).name, "SHA-256")
    doc = doc_of(ck)
    doc["files"]["model"] = "../../../etc/passwd"
    write_doc(ck, doc)
    for argv in (["generate", "--model", str(ck), "--prompt", "a"],
                 ["train", "--out", str(ck), "--resume", "--quiet"],
                 ["explain", "a", "--token", "a", "--model", str(ck)]):
        cli_one_line_error(capsys, argv, "'files.model' must be a plain .safetensors file name")
    (ck / "attnlab.json").write_text("{")
    cli_one_line_error(capsys, ["train", "--out", str(ck), "--resume", "--quiet"],
                       "not valid JSON")
    cli_one_line_error(capsys, ["train", "--out", str(ck), "--quiet"], "already holds")


# -- older checkpoints -------------------------------------------------------------------------


def test_a_version_1_checkpoint_loads_unverified_and_resaves_with_hashes(ck):
    as_legacy(ck)
    model, _ = load_checkpoint(ck)
    assert model.config.n_layer == 1
    t = Trainer.resume(ck, max_steps=3)
    t.run()
    doc = doc_of(ck)
    assert doc["version"] == 2 and doc["state"]["step"] == 3 and set(doc["sha256"]) == {
        "model", "trainer"}


# -- the output directory ----------------------------------------------------------------------


def test_an_output_path_that_cannot_be_a_directory_fails_before_training(tmp_path, capsys,
                                                                         monkeypatch):
    (tmp_path / "file").write_text("not a directory")
    out = tmp_path / "file" / "run"
    steps = []
    monkeypatch.setattr(Trainer, "train_step", lambda self: steps.append(1))
    with pytest.raises(AttnlabError, match="out: cannot write checkpoints to"):
        Trainer.start("tiny", out=out, **RUN)
    cli_one_line_error(capsys, ["train", "--out", str(out), "--max-steps", "2", "--quiet"],
                       "--out: cannot write checkpoints to")
    assert steps == []


def test_a_read_only_directory_fails_before_training(tmp_path, capsys, monkeypatch, trained):
    """Root writes through permission bits, so the read-only file system is simulated where the
    probe meets the OS: every open that would create a file in `ro` fails with EROFS."""
    ro = tmp_path / "ro"
    shutil.copytree(trained, ro)
    real_open = os.open

    def read_only_open(path, flags, *args, **kwargs):
        if os.path.dirname(os.path.abspath(path)) == str(ro) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    steps = []
    monkeypatch.setattr(Trainer, "train_step", lambda self: steps.append(1))
    monkeypatch.setattr(os, "open", read_only_open)
    with pytest.raises(AttnlabError, match=r"out: cannot write checkpoints to .*Read-only"):
        Trainer.resume(ro, max_steps=4)
    with pytest.raises(AttnlabError, match="Read-only"):
        Trainer.start("tiny", out=ro, **RUN)
    cli_one_line_error(capsys, ["train", "--out", str(ro), "--resume", "--max-steps", "4",
                                "--quiet"], "--out: cannot write checkpoints to", "Read-only")
    assert steps == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_a_directory_without_write_permission_fails_before_training(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(AttnlabError, match="out: cannot write checkpoints to"):
            Trainer.start("tiny", out=ro, **RUN)
    finally:
        ro.chmod(0o700)


# -- leftovers of killed saves -----------------------------------------------------------------


def test_the_next_save_removes_temp_files_of_killed_saves(ck):
    stale = [".attnlab.json.4242.tmp", ".model-00000002-0badcafe.safetensors.4242.tmp",
             ".trainer-00000002-0badcafe.safetensors.77.tmp", ".attnlab-probe-x1y2z3.tmp"]
    kept = ["notes.txt", ".attnlab.json.backup", ".something.tmp"]
    for name in stale + kept:
        (ck / name).write_bytes(b"partial")
    model, tok = load_checkpoint(ck)
    save_checkpoint(ck, model, tok, state={"step": 5, "history": []})
    names = {p.name for p in ck.iterdir()}
    assert not names & set(stale), names
    assert set(kept) <= names


# -- pickles -----------------------------------------------------------------------------------


class _RunsCodeWhenUnpickled:
    def __reduce__(self):
        return (print, ("unpickled",))


@pytest.mark.parametrize("payload", ["state_dict", "code"])
def test_a_pickle_checkpoint_is_refused_by_name(tmp_path, capsys, payload):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "bert"}))
    obj = {"w": torch.zeros(2)} if payload == "state_dict" else {"w": _RunsCodeWhenUnpickled()}
    torch.save(obj, d / "pytorch_model.bin")
    for target in (d, d / "pytorch_model.bin"):
        with pytest.raises(AttnlabError, match="attnlab loads safetensors weights only") as e:
            load_model(target)
        assert "weights_only" not in str(e.value)
        with pytest.raises(AttnlabError, match=r"pytorch_model\.bin is a pickle file"):
            load_checkpoint(target)
        err = cli_one_line_error(capsys, ["explain", "a b", "--token", "a", "--model",
                                          str(target)], "safetensors weights only")
        assert "weights_only" not in err
        cli_one_line_error(capsys, ["generate", "--model", str(target), "--prompt", "a"],
                           "safetensors weights only")
    assert "unpickled" not in capsys.readouterr().out


# -- numbers, nesting and file kinds in a tampered checkpoint ------------------------------------


@pytest.mark.parametrize("section, key, value, needle", [
    ("model", "n_embd", 10**9, "n_embd: 1e+09 is beyond the limit of 32,768"),
    ("model", "n_layer", 10**9, "n_layer: 1e+09 is beyond the limit"),
    ("model", "vocab_size", 10**12, "vocab_size: 1e+12 is beyond the limit"),
    ("model", "block_size", 10**9, "block_size: 1e+09 is beyond the limit"),
    ("model", "n_head", 2**14, "n_head: 1.64e+04 is beyond the limit"),
    ("model", "rope_base", float("nan"), "rope_base: expected a finite number"),
    ("train", "batch_size", 10**12, "batch_size: 1e+12 is beyond the limit"),
    ("train", "eval_batches", 10**12, "eval_batches: 1e+12 is beyond the limit"),
    ("train", "seed", 10**30, "seed: expected an integer of magnitude below 2**40"),
    ("train", "beta1", float("nan"), "beta1: expected a finite number"),
    ("train", "grad_clip", float("inf"), "grad_clip: expected a finite number"),
])
def test_every_config_number_is_bounded_before_anything_is_built(ck, capsys, section, key,
                                                                 value, needle):
    doc = doc_of(ck)
    doc[section][key] = value
    write_doc(ck, doc)
    with pytest.raises(AttnlabError, match=f"'{section}' is not valid") as e:
        Trainer.resume(ck)
    assert needle in str(e.value)
    cli_one_line_error(capsys, ["train", "--out", str(ck), "--resume", "--quiet"], needle)
    if section == "model":
        cli_one_line_error(capsys, ["generate", "--model", str(ck), "--prompt", "a"],
                           needle)


def test_a_config_within_each_bound_but_too_big_as_a_whole_is_refused():
    from attnlab.models.config import GPTConfig

    with pytest.raises(AttnlabError, match=r"about 12,583,109,632 parameters .* limit is 1,073,"):
        GPTConfig(n_layer=1000, n_embd=1024, n_head=8)
    with pytest.raises(AttnlabError, match="4096 rows of block_size 4096 are 16,777,216 tokens"):
        Trainer.start("tiny", batch_size=4096, model_overrides={**SMALL, "block_size": 4096})


def test_deeply_nested_attnlab_json_is_one_clear_error(ck, capsys):
    (ck / "attnlab.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(AttnlabError, match="nested deeper than the decoder's limit"):
        load_checkpoint(ck)
    assert not is_checkpoint(ck)
    cli_one_line_error(capsys, ["train", "--out", str(ck), "--resume", "--quiet"],
                       "nested deeper")


def test_an_oversized_attnlab_json_is_refused_unread(ck, monkeypatch):
    from attnlab.models import checkpoint_checks

    monkeypatch.setattr(checkpoint_checks, "MAX_META_BYTES", 100)
    with pytest.raises(AttnlabError, match="bytes, more than the 100 attnlab reads"):
        load_checkpoint(ck)


@pytest.mark.parametrize("kind", ["model", "trainer"])
def test_a_tensor_file_bigger_than_its_config_allows_is_refused_unread(ck, kind):
    with open(tensor_file(ck, kind), "r+b") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB for a model of ~5,000 parameters
    with pytest.raises(AttnlabError, match=r"is 67,108,864 bytes, more than the [\d,]+ attnlab "
                       "reads for it"):
        read_checkpoint(ck, with_trainer=True)


def test_an_attnlab_json_linked_from_outside_is_refused(ck, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(ck / "attnlab.json", outside / "attnlab.json")
    (ck / "attnlab.json").symlink_to(outside / "attnlab.json")
    with pytest.raises(AttnlabError, match=r"attnlab\.json is a link to .*outside the checkpoint"):
        load_checkpoint(ck)


@pytest.mark.parametrize("what", ["attnlab.json", "model"])
@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_directory_or_fifo_where_a_file_should_be_says_so(ck, capsys, what, kind):
    path = ck / "attnlab.json" if what == "attnlab.json" else tensor_file(ck)
    path.unlink()
    if kind == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)  # opening it to read would block: the loader must not
    needle = "is a directory, not a regular file" if kind == "directory" else "is a FIFO"
    with pytest.raises(AttnlabError, match=needle) as e:
        load_checkpoint(ck)
    assert "missing" not in str(e.value) and path.name in str(e.value)
    cli_one_line_error(capsys, ["train", "--out", str(ck), "--resume", "--quiet"], needle)


@pytest.mark.parametrize("saves", [1, 2])
def test_a_read_while_a_run_saves_reads_the_new_checkpoint(ck, monkeypatch, saves):
    """A save between reading attnlab.json and its tensor files removes the files it named: the
    read starts again from the new attnlab.json (a second process resuming or explaining a live
    run), and a directory that keeps changing gives up with the last error, after READS reads."""
    from attnlab.models import checkpoint

    m, tok = load_checkpoint(ck)
    real, calls = checkpoint.read_tensor_file, []

    def racing(st, path, *a, **kw):  # a live run saves just before each of the first reads
        calls.append(path.name)
        if len(calls) <= saves:
            save_checkpoint(ck, m, tok, state={"step": 10 + len(calls), "history": []})
        return real(st, path, *a, **kw)

    monkeypatch.setattr(checkpoint, "read_tensor_file", racing)
    monkeypatch.setattr(checkpoint, "READS", 2)
    if saves == 1:
        got = read_checkpoint(ck)
        assert got.step == 11 and len(calls) == 2
        assert all(torch.equal(got.weights[k], v) for k, v in m.state_dict().items())
    else:  # it changed under both reads
        with pytest.raises(AttnlabError, match=r"named in attnlab\.json, is missing"):
            read_checkpoint(ck)
        assert len(calls) == 2


def test_a_missing_file_without_a_save_is_reported_at_once(ck, monkeypatch):
    from attnlab.models import checkpoint

    calls = []
    real = checkpoint.read_tensor_file
    monkeypatch.setattr(checkpoint, "read_tensor_file",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    tensor_file(ck).unlink()
    with pytest.raises(AttnlabError, match=r"named in attnlab\.json, is missing"):
        read_checkpoint(ck)
    assert len(calls) == 1  # attnlab.json did not change: no second read
