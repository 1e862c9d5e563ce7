"""What a checkpoint must be before anything in it is used: the checks behind `read_checkpoint`.

A checkpoint directory is untrusted input. `attnlab.json` must be a JSON object of the attnlab-gpt
format with every field the loader reads; the files it names must be plain `.safetensors` file
names inside the directory (no path, no symlink leading out); each tensor file must match the
SHA-256 recorded for it, parse as safetensors, and hold only finite numbers. Every failure is one
AttnlabError naming the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path

import torch

from attnlab.errors import AttnlabError, fmt_shape

META_FILE = "attnlab.json"
FORMAT = "attnlab-gpt"
#: version 2 records a SHA-256 per tensor file; version 1 (no hashes) is read unverified
VERSION, READABLE_VERSIONS = 2, (1, 2)
KINDS = ("model", "trainer")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: the largest attnlab.json read (its training history grows ~70 bytes a step)
MAX_META_BYTES = 256 << 20


#: weights saved with pickle (torch.save): loading one can run any code, so attnlab never does
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def pickle_refusal(path) -> str | None:
    """Why `path` is refused when it is, or is a directory holding only, pickled weights."""
    p = Path(path)
    if p.is_file():
        names = [p.name] if p.name.lower().endswith(PICKLE_SUFFIXES) else []
    elif p.is_dir() and not any(p.glob("*.safetensors")):
        names = sorted(f.name for f in p.iterdir() if f.name.lower().endswith(PICKLE_SUFFIXES))
    else:
        names = []
    if not names:
        return None
    return (f"{names[0]} is a pickle file (torch.save); attnlab loads safetensors weights "
            "only, because loading a pickle can run any code it holds. Pass a directory with "
            ".safetensors weights (a checkpoint from attnlab train, or a model saved with "
            "save_pretrained)")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_file(p: Path, name: str, limit: int | None = None) -> bytes:
    """The bytes of file `name` in checkpoint directory `p`: a regular file (a link only to one
    inside `p`), at most `limit` bytes. Never blocks on a FIFO; says what stands there instead."""
    path = p / name
    if path.is_symlink() and path.resolve().parent != p.resolve():
        raise AttnlabError(f"checkpoint: {path} is a link to {path.resolve()}, outside the "
                           "checkpoint directory")
    try:  # O_NONBLOCK: opening a FIFO returns at once, and fstat tells what was opened
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise AttnlabError(f"checkpoint: {path}, named in {META_FILE}, is missing"
                           if name != META_FILE else f"checkpoint: {path} is missing") from None
    except OSError as e:
        raise AttnlabError(f"checkpoint: cannot read {path} ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise AttnlabError(f"checkpoint: {path} is {_file_kind(st.st_mode)}, not a regular "
                               "file")
        if limit is not None and st.st_size > limit:
            raise AttnlabError(f"checkpoint: {path} is {st.st_size:,} bytes, more than the "
                               f"{limit:,} attnlab reads for it")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            fd = None
            return f.read() if limit is None else f.read(limit + 1)
    except OSError as e:
        raise AttnlabError(f"checkpoint: cannot read {path} ({e.strerror or e})") from None
    finally:
        if fd is not None:
            os.close(fd)


def _file_kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return "not a regular file"


def parse_doc(p: Path) -> dict:
    """attnlab.json of directory `p`, checked field by field."""
    meta = p / META_FILE
    data = read_file(p, META_FILE, MAX_META_BYTES)
    if len(data) > MAX_META_BYTES:  # it grew between fstat and read
        raise AttnlabError(f"checkpoint: {meta} is more than the {MAX_META_BYTES:,} bytes "
                           "attnlab reads")
    try:
        doc = json.loads(data.decode("utf-8"))
    except ValueError as e:  # bad JSON or bad UTF-8
        raise AttnlabError(f"checkpoint: {meta} is not valid JSON ({e})") from None
    except RecursionError:  # the decoder recurses once per level of [ or {
        raise AttnlabError(f"checkpoint: {meta} is not a checkpoint's JSON: it is nested "
                           "deeper than the decoder's limit") from None
    if not isinstance(doc, dict):
        raise AttnlabError(f"checkpoint: {meta}: expected a JSON object, got "
                           f"{type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise AttnlabError(f"checkpoint: {meta}: format {doc.get('format')!r}, expected "
                           f"{FORMAT!r}")
    if doc.get("version") not in READABLE_VERSIONS:
        raise AttnlabError(f"checkpoint: {meta}: format version {doc.get('version')!r}; this "
                           f"attnlab reads versions {list(READABLE_VERSIONS)}")
    for key in ("files", "model", "tokenizer", "state"):
        _field(meta, doc, key, dict)
    if doc.get("train") is not None:
        _field(meta, doc, "train", dict)
    step = _field(meta, doc["state"], "step", int, "state.step")
    if isinstance(step, bool) or step < 0:
        raise AttnlabError(f"checkpoint: {meta}: 'state.step' must be a step number >= 0, got "
                           f"{step!r}")
    files = doc["files"]
    _field(meta, files, "model", str, "files.model")
    for kind in KINDS:
        if files.get(kind) is not None:
            check_file_name(p, f"files.{kind}", files[kind])
    if doc["version"] >= 2:
        hashes = _field(meta, doc, "sha256", dict)
        for kind in KINDS:
            if files.get(kind) is not None and not _SHA256.match(str(hashes.get(kind))):
                raise AttnlabError(f"checkpoint: {meta}: 'sha256.{kind}' must be the 64-digit "
                                   f"SHA-256 of {files[kind]}, got {hashes.get(kind)!r}")
    return doc


def _field(meta: Path, d: dict, key: str, kind: type, label: str | None = None):
    label = label or key
    if key not in d:
        raise AttnlabError(f"checkpoint: {meta}: missing {label!r}")
    if not isinstance(d[key], kind):
        raise AttnlabError(f"checkpoint: {meta}: {label!r} must be a JSON "
                           f"{_JSON_NAMES[kind]}, got {d[key]!r:.80}")
    return d[key]


_JSON_NAMES = {dict: "object", str: "string", int: "integer", list: "array"}


def check_file_name(p: Path, label: str, name) -> Path:
    """`p / name` for a plain `.safetensors` file name that stays inside directory `p`."""
    plain = (isinstance(name, str) and name.endswith(".safetensors") and not name.startswith(".")
             and not any(c in name for c in "/\\\0:") and Path(name).name == name)
    if not plain:
        raise AttnlabError(f"checkpoint: {p / META_FILE}: {label!r} must be a plain "
                           f".safetensors file name inside the checkpoint directory, got "
                           f"{name!r:.120}")
    path = p / name
    if path.is_symlink() and path.resolve().parent != p.resolve():
        raise AttnlabError(f"checkpoint: {path} is a link to {path.resolve()}, outside the "
                           "checkpoint directory")
    return path


def read_tensor_file(st, path: Path, want_sha: str | None, want_step: int,
                     max_bytes: int | None = None) -> dict:
    """The tensors of one safetensors file (at most `max_bytes`, checked before reading), after
    its hash, format, step and values check out."""
    from safetensors import SafetensorError

    data = read_file(path.parent, path.name, max_bytes)
    if want_sha is not None and sha256(data) != want_sha:
        raise AttnlabError(f"checkpoint: {path} does not match the SHA-256 recorded in "
                           f"{META_FILE}: the file is damaged or was changed")
    if not data:
        raise AttnlabError(f"checkpoint: {path} is empty")
    try:
        tensors = st.load(data)
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n])
    except (SafetensorError, ValueError, RuntimeError, TypeError, OverflowError) as e:
        raise AttnlabError(f"checkpoint: {path} is not a readable safetensors file "
                           f"({_first_line(e)})") from None
    got = (header.get("__metadata__") or {}).get("step")
    if got != str(want_step):
        raise AttnlabError(f"checkpoint: {path} is from step {got} but {META_FILE} says step "
                           f"{want_step}; the checkpoint is incomplete")
    check_finite(tensors, f"checkpoint: {path}:", "refusing to load it (the run that wrote it "
                 "diverged)")
    return tensors


def check_finite(tensors: dict, prefix: str, consequence: str) -> None:
    """Raise when any floating-point tensor holds NaN or Inf."""
    for name, t in tensors.items():
        if t.is_floating_point() or t.is_complex():
            bad = int(t.numel() - torch.isfinite(t).sum())
            if bad:
                raise AttnlabError(f"{prefix} {name!r} holds {bad} NaN/Inf of {t.numel()} "
                                   f"values; {consequence}")


def check_weights_fit(path: Path, weights: dict, expected: dict) -> None:
    """`weights` has exactly the names, shapes and float dtypes of `expected` (a state_dict)."""
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected]
    if missing or unexpected:
        raise AttnlabError(f"checkpoint: {path} does not fit the model config in {META_FILE} "
                           f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    for k, want in expected.items():
        got = weights[k]
        if got.shape != want.shape:
            raise AttnlabError(f"checkpoint: {path}: tensor {k!r} has shape "
                               f"{fmt_shape(got.shape)}, the model config needs "
                               f"{fmt_shape(want.shape)}")
        if not got.is_floating_point():
            raise AttnlabError(f"checkpoint: {path}: tensor {k!r} has dtype {got.dtype}, "
                               "expected a floating-point dtype")


def checked_config(meta: Path, label: str, make, d):
    """`make(d)`, with a bad config reported as one line naming attnlab.json."""
    try:
        return make(d)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise AttnlabError(f"checkpoint: {meta}: {label!r} is not valid ({_first_line(e)})") \
            from None


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
