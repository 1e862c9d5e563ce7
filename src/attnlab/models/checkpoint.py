"""Checkpoints: a directory with the weights as safetensors and the rest as JSON.

    DIR/model-STEP-ID.safetensors    model weights (metadata: the step they belong to)
    DIR/trainer-STEP-ID.safetensors  AdamW moments and the torch RNG state, for resuming
    DIR/attnlab.json                 {"format", "version", "files": {"model", "trainer"},
                                      "model": GPTConfig, "tokenizer": spec,
                                      "train": TrainConfig, "state": {"step", "history", ...}}

A save writes the tensors to new file names, then replaces attnlab.json atomically (temp file,
fsync, os.replace) — the one commit point — and only then removes the files the old attnlab.json
named. A crash at any moment leaves the previous checkpoint or the new one, both complete; a step
mismatch between the files is reported instead of loaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import AttnlabError
from attnlab.models.config import GPTConfig
from attnlab.models.tokenizer import tokenizer_from_spec

META_FILE = "attnlab.json"
FORMAT, VERSION = "attnlab-gpt", 1


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
    """Write `model` (a GPT), its tokenizer and optional training state to directory `path`."""
    st = _safetensors()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = dict(state or {"step": 0, "history": []})
    step = state.get("step", 0)
    meta = {"step": str(step)}
    files = {"model": _tensor_file("model", step), "trainer": None}
    if trainer_tensors is not None:
        files["trainer"] = _tensor_file("trainer", step)
        atomic_write(path / files["trainer"], st.save(trainer_tensors, metadata=meta))
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_write(path / files["model"], st.save(weights, metadata=meta))
    doc = {"format": FORMAT, "version": VERSION, "files": files,
           "model": model.config.to_dict(), "tokenizer": tokenizer.spec(),
           "train": None if train_config is None else train_config.to_dict(), "state": state}
    atomic_write(path / META_FILE, (json.dumps(doc, indent=1) + "\n").encode("utf-8"))
    _remove_unreferenced(path, keep={f for f in files.values() if f})
    return path


def _remove_unreferenced(path: Path, keep: set[str]) -> None:
    for old in [*path.glob("model-*.safetensors"), *path.glob("trainer-*.safetensors")]:
        if old.name not in keep:
            old.unlink(missing_ok=True)


def _read_doc(p: Path) -> dict | None:
    try:
        doc = json.loads((p / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == FORMAT else None


def is_checkpoint(path) -> bool:
    """True when `path` is a directory holding an attnlab GPT checkpoint."""
    try:
        doc = _read_doc(Path(path))
        return doc is not None and (Path(path) / doc["files"]["model"]).is_file()
    except (KeyError, TypeError):
        return False


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


def read_checkpoint(path, *, with_trainer: bool = False) -> Checkpoint:
    st = _safetensors()
    p = Path(path)
    if not is_checkpoint(p):
        raise AttnlabError(f"checkpoint: no attnlab checkpoint at {str(path)!r} (expected a "
                           f"directory with {META_FILE} and the weights it names)")
    doc = _read_doc(p)
    if doc.get("version") != VERSION:
        raise AttnlabError(f"checkpoint: {p} has format version {doc.get('version')!r}; this "
                           f"attnlab reads version {VERSION}")
    step = str(doc["state"]["step"])
    kinds = ["model"] + (["trainer"] if with_trainer else [])
    tensors = {}
    for kind in kinds:
        name = doc["files"].get(kind)
        if not name or not (p / name).is_file():
            raise AttnlabError(f"checkpoint: {p} has no {kind} state; it cannot be resumed")
        with st.safe_open(p / name, framework="pt") as f:
            got = (f.metadata() or {}).get("step")
            if got != step:
                raise AttnlabError(f"checkpoint: {p / name} is from step {got} but {META_FILE} "
                                   f"says step {step}; the checkpoint is incomplete")
            tensors[kind] = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    return Checkpoint(p, doc, tensors["model"], tensors.get("trainer"))


def model_from_checkpoint(ck: Checkpoint):
    from attnlab.models.gpt import GPT

    model = GPT(GPTConfig.from_dict(ck.doc["model"]))
    missing, unexpected = model.load_state_dict(ck.weights, strict=False)
    if missing or unexpected:
        name = ck.path / ck.doc["files"]["model"]
        raise AttnlabError(f"checkpoint: {name} does not fit the config "
                           f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.name_or_path = str(ck.path)
    return model


def load_checkpoint(path):
    """(model, tokenizer) from a checkpoint directory; the model is on CPU in eval mode and
    carries its tokenizer as `model.tokenizer`."""
    ck = read_checkpoint(path)
    model = model_from_checkpoint(ck).eval()
    tokenizer = tokenizer_from_spec(ck.doc["tokenizer"])
    model.tokenizer = tokenizer
    return model, tokenizer
