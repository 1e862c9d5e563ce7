"""Checkpoints: a directory with the weights as safetensors and the rest as JSON.

    DIR/model-STEP-ID.safetensors    model weights (metadata: the step they belong to)
    DIR/trainer-STEP-ID.safetensors  AdamW moments and the torch RNG state, for resuming
    DIR/attnlab.json                 {"format", "version", "files": {"model", "trainer"},
                                      "sha256": {"model", "trainer"},
                                      "model": GPTConfig, "tokenizer": spec,
                                      "train": TrainConfig, "state": {"step", "history", ...}}

A save refuses weights or optimizer state holding NaN/Inf, writes the tensors to new file names,
then replaces attnlab.json atomically (temp file, fsync, os.replace) — the one commit point — and
only then removes the files the old attnlab.json named and any temp files a killed save left. A
crash at any moment leaves the previous checkpoint or the new one, both complete. A read while a
live run saves (a second process resuming or explaining it) that finds a named file removed reads
the new attnlab.json again.

A load trusts nothing in the directory (see `checkpoint_checks`): file names must be plain names
inside it, each tensor file must match its recorded SHA-256, parse, hold finite values of the
shapes the config needs, and carry the step attnlab.json names. Checkpoints of format version 1
(written before hashes were recorded) load without the hash check; the next save records them.
Caution: one process may save to a directory at a time (a second would delete the first's
files): `Trainer` holds the directory's lock (`run_lock`) while it trains and saves;
`save_checkpoint` called directly does not lock.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.errors import AttnlabError
from attnlab.models.checkpoint_checks import (
    FORMAT,
    KINDS,
    META_FILE,
    VERSION,
    check_finite,
    check_weights_fit,
    checked_config,
    parse_doc,
    pickle_refusal,
    read_tensor_file,
    sha256,
)
from attnlab.models.config import GPTConfig
from attnlab.models.tokenizer import tokenizer_from_spec

#: temp files of atomic_write (".NAME.PID.tmp") and check_writable, left behind by a killed save
_STALE_TMP = re.compile(r"^\.(attnlab\.json|(model|trainer)-[\w.-]*\.safetensors)\.\d+\.tmp$"
                        r"|^\.attnlab-probe-[\w-]+\.tmp$")


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    try:  # make the rename itself durable; not every platform can open a directory
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_writable(path, what: str = "out") -> Path:
    """Create directory `path` if needed and create and remove a file in it, so that a place
    checkpoints cannot be written to fails before training starts, not at the first save.
    (Permission bits alone would not tell: root writes through them, a read-only mount does not.)"""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".attnlab-probe-", suffix=".tmp", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise AttnlabError(f"{what}: cannot write checkpoints to {str(path)!r} "
                           f"({e.strerror or e})") from None
    return path


def _safetensors():
    try:
        from safetensors import torch as st
    except ImportError:
        raise AttnlabError("checkpoints need safetensors: pip install 'attnlab[train]'") from None
    return st


def _tensor_file(kind: str, step) -> str:
    """A name no earlier save used: the old file stays valid until attnlab.json moves on."""
    return f"{kind}-{int(step):08d}-{os.urandom(4).hex()}.safetensors"


def save_checkpoint(path, model, tokenizer, *, train_config=None, state=None,
                    trainer_tensors: dict | None = None) -> Path:
    """Write `model` (a GPT), its tokenizer and optional training state to directory `path`.

    Raises AttnlabError, writing nothing, when a weight or optimizer tensor holds NaN or Inf: a
    diverged run never replaces a good checkpoint."""
    st = _safetensors()
    path = Path(path)
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tensors = {"model": weights, "trainer": trainer_tensors}
    for kind, ts in tensors.items():
        if ts is not None:
            check_finite(ts, f"checkpoint: refusing to save to {path}: {kind} tensor",
                         "the previous checkpoint is kept")
    path.mkdir(parents=True, exist_ok=True)
    state = dict(state or {"step": 0, "history": []})
    step = state.get("step", 0)
    meta = {"step": str(step)}
    files, hashes = dict.fromkeys(KINDS), dict.fromkeys(KINDS)
    for kind in ("trainer", "model"):
        if tensors[kind] is not None:
            data = st.save(tensors[kind], metadata=meta)
            files[kind], hashes[kind] = _tensor_file(kind, step), sha256(data)
            atomic_write(path / files[kind], data)
    doc = {"format": FORMAT, "version": VERSION, "files": files, "sha256": hashes,
           "model": model.config.to_dict(), "tokenizer": tokenizer.spec(),
           "train": None if train_config is None else train_config.to_dict(), "state": state}
    atomic_write(path / META_FILE, (json.dumps(doc, indent=1) + "\n").encode("utf-8"))
    _remove_leftovers(path, keep={f for f in files.values() if f})
    return path


def _remove_leftovers(path: Path, keep: set[str]) -> None:
    """Tensor files attnlab.json no longer names, and temp files of killed saves."""
    for old in path.iterdir():
        name = old.name
        stale = (name.startswith(("model-", "trainer-")) and name.endswith(".safetensors")
                 and name not in keep) or _STALE_TMP.match(name)
        if stale and not old.is_dir():
            old.unlink(missing_ok=True)


def is_checkpoint(path) -> bool:
    """True when `path` is a directory holding an attnlab.json of an attnlab GPT checkpoint that
    passes its checks and names a model file that exists (the tensors are checked on load)."""
    p = Path(path)
    if not (p / META_FILE).is_file():
        return False
    try:
        doc = parse_doc(p)
    except AttnlabError:
        return False
    return (p / doc["files"]["model"]).is_file()


@dataclass
class Checkpoint:
    """A checkpoint read from disk: its JSON document and tensors."""

    path: Path
    doc: dict
    weights: dict
    trainer_tensors: dict | None

    @property
    def step(self) -> int:
        return int(self.doc["state"]["step"])

    def file(self, kind: str) -> Path:
        """The tensor file of `kind` ("model" or "trainer"), for messages."""
        return self.path / self.doc["files"][kind]


def read_checkpoint(path, *, with_trainer: bool = False) -> Checkpoint:
    """The checked document and tensors of checkpoint directory `path`; AttnlabError naming the
    file and the fault for anything that does not check out."""
    st = _safetensors()
    p = Path(path)
    if not os.path.lexists(p / META_FILE):  # anything else standing there is reported below
        refusal = pickle_refusal(p)
        if refusal:
            raise AttnlabError(f"checkpoint: {p}: {refusal}")
        raise AttnlabError(f"checkpoint: no attnlab checkpoint at {str(path)!r} (expected a "
                           f"directory with {META_FILE} and the weights it names)")
    for _ in range(READS - 1):
        seen = _meta_id(p)
        try:
            return _read(st, p, with_trainer)
        except AttnlabError:
            # the same attnlab.json as when this read began: the fault is the directory's; a new
            # one: a save committed while this read ran and removed the files the old one named
            if _meta_id(p) in (seen, None):
                raise
    return _read(st, p, with_trainer)


READS = 3  # reads of a checkpoint that saves keep replacing before its error is reported


def _meta_id(p: Path):
    """What changes when a save replaces attnlab.json (os.replace: a new inode), or None."""
    try:
        st = os.stat(p / META_FILE)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _read(st, p: Path, with_trainer: bool) -> Checkpoint:
    doc = parse_doc(p)
    # the config bounds the tensor files' size before they are read into memory
    config = checked_config(p / META_FILE, "model", GPTConfig.from_dict, doc["model"])
    tensors = {}
    for kind in ["model"] + (["trainer"] if with_trainer else []):
        name = doc["files"].get(kind)
        if not name:
            raise AttnlabError(f"checkpoint: {p} has no {kind} state; it cannot be resumed")
        want = doc["sha256"][kind] if doc["version"] >= 2 else None
        tensors[kind] = read_tensor_file(st, p / name, want, doc["state"]["step"],
                                         max_bytes=_max_file_bytes(config))
    return Checkpoint(p, doc, tensors["model"], tensors.get("trainer"))


def _max_file_bytes(config: GPTConfig) -> int:
    """More than any tensor file of a model of `config` can hold: float64 weights, or AdamW's
    two moments of each, with room for biases, norms and the RNG state."""
    return 3 * 8 * (config.approx_params() * 5 // 4 + (1 << 20))


def model_from_checkpoint(ck: Checkpoint, *, dropout: float | None = None):
    """The checkpoint's GPT (`dropout` replaces the config's: it holds no weights)."""
    from attnlab.models.gpt import GPT

    config = checked_config(ck.path / META_FILE, "model", GPTConfig.from_dict, ck.doc["model"])
    if dropout is not None:
        config = GPTConfig.from_dict({**config.to_dict(), "dropout": dropout})
    layers = {k.split(".")[1] for k in ck.weights if k.startswith("blocks.")}
    if len(layers) != config.n_layer:  # before building: n_layer is a loop count
        raise AttnlabError(f"checkpoint: {ck.file('model')} holds {len(layers)} layers but "
                           f"{META_FILE} says n_layer {config.n_layer}")
    with torch.device("meta"):  # shapes first: a config that lies about its size allocates nothing
        expected = GPT(config).state_dict()
    check_weights_fit(ck.file("model"), ck.weights, expected)
    model = GPT(config)
    model.load_state_dict(ck.weights)
    model.name_or_path = str(ck.path)
    return model


def tokenizer_from_checkpoint(ck: Checkpoint, vocab_size: int):
    meta = ck.path / META_FILE
    tok = checked_config(meta, "tokenizer", tokenizer_from_spec, ck.doc["tokenizer"])
    if tok.vocab_size > vocab_size:
        raise AttnlabError(f"checkpoint: {meta}: the tokenizer has {tok.vocab_size} symbols but "
                           f"the model's vocab_size is {vocab_size}")
    return tok


def load_checkpoint(path):
    """(model, tokenizer) from a checkpoint directory; the model is on CPU in eval mode and
    carries its tokenizer as `model.tokenizer`."""
    ck = read_checkpoint(path)
    model = model_from_checkpoint(ck).eval()
    tokenizer = tokenizer_from_checkpoint(ck, model.config.vocab_size)
    model.tokenizer = tokenizer
    return model, tokenizer
