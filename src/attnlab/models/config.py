"""GPTConfig and TrainConfig: dataclasses with derived fields and named presets.

    >>> cfg = GPTConfig.from_name("tiny", vocab_size=65)
    >>> cfg.head_dim, cfg.n_kv_head
    (24, 4)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from attnlab.errors import AttnlabError, check_dropout, check_positive_int

#: the largest value each size may take: a config from an untrusted checkpoint is checked against
#: these before anything is built from it, so a tampered number is one clear error, not an
#: allocation failure or an overflow (far above any model or run this CPU trainer is for)
LIMITS = {"vocab_size": 1 << 20, "block_size": 1 << 16, "n_layer": 1024, "n_head": 1024,
          "n_kv_head": 1024, "n_embd": 1 << 15,
          "max_steps": 10**9, "batch_size": 1 << 16, "eval_interval": 10**9,
          "eval_batches": 10_000, "warmup_steps": 10**9}
#: parameters a GPTConfig may describe (4 GiB of float32 weights)
MAX_PARAMS = 1 << 30
#: the largest learning rate: AdamW's float32 update overflows into an error near 1e38 (useful
#: rates are below 1; a huge one diverges, and training stops with a clear error)
MAX_LR = 1e30
#: |seed| bound: batch generators are seeded with seed * 1_000_003 + step, inside 64 bits
MAX_SEED = 1 << 40

#: name -> {"model": GPTConfig fields, "train": TrainConfig fields}
PRESETS: dict[str, dict[str, dict]] = {
    # ~0.36M parameters, 600 steps of 24 x 64 characters: about a minute on one idle CPU core
    "tiny": {
        "model": {"block_size": 64, "n_layer": 3, "n_head": 4, "n_embd": 96},
        "train": {"max_steps": 600, "batch_size": 24, "lr": 3e-3, "min_lr": 3e-4,
                  "warmup_steps": 30, "eval_interval": 100},
    },
    # the same size with grouped-query attention (2 k/v heads) and rotary positions
    "tiny-gqa": {
        "model": {"block_size": 64, "n_layer": 3, "n_head": 4, "n_kv_head": 2, "n_embd": 96,
                  "rotary": True},
        "train": {"max_steps": 600, "batch_size": 24, "lr": 3e-3, "min_lr": 3e-4,
                  "warmup_steps": 30, "eval_interval": 100},
    },
    # induction heads forming (Olsson et al. 2022): 2 attention-only layers (43k parameters),
    # rotary positions, and half the training windows a stretch of Shakespeare repeated to fill
    # the window (repeat_prob, see attnlab.models.repeats); validation stays plain text. The
    # induction score leaves chance near step 450 and passes 0.4 near step 1,000: about 6 minutes
    # on one thread of a busy 2-core machine (docs/learn/heads.md)
    "induction": {
        "model": {"block_size": 128, "n_layer": 2, "n_head": 4, "n_embd": 64, "rotary": True,
                  "attn_only": True},
        "train": {"max_steps": 1500, "batch_size": 16, "lr": 1e-2, "min_lr": 1e-3,
                  "warmup_steps": 100, "eval_interval": 50, "eval_batches": 4,
                  "repeat_prob": 0.5},
    },
    # ~2.7M parameters; about an hour on a laptop CPU
    "small": {
        "model": {"block_size": 256, "n_layer": 6, "n_head": 6, "n_embd": 192, "dropout": 0.1},
        "train": {"max_steps": 3000, "batch_size": 32, "lr": 1e-3, "min_lr": 1e-4,
                  "warmup_steps": 100, "eval_interval": 250},
    },
}


def _preset(name: str) -> dict:
    if name not in PRESETS:
        raise AttnlabError(f"preset: unknown {name!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[name]


@dataclass
class GPTConfig:
    """Model sizes. head_dim is derived; n_kv_head defaults to n_head (plain multi-head)."""

    vocab_size: int = 65
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    rotary: bool = False
    rope_base: float = 10000.0
    #: blocks of attention alone (no MLP): the circuits of Elhage et al. 2021 read off directly
    attn_only: bool = False
    name: str = "custom"
    head_dim: int = field(init=False)

    def __post_init__(self):
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        for f in ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd"):
            _bounded(f, check_positive_int(f, getattr(self, f)))
        if self.n_embd % self.n_head:
            raise AttnlabError(f"n_head: n_embd {self.n_embd} is not divisible by n_head "
                               f"{self.n_head}")
        if self.n_head % self.n_kv_head:
            raise AttnlabError(f"n_kv_head: n_head {self.n_head} is not a multiple of n_kv_head "
                               f"{self.n_kv_head}")
        self.dropout = check_dropout(self.dropout)
        self.head_dim = self.n_embd // self.n_head
        if self.rotary and self.head_dim % 2:
            raise AttnlabError(f"rotary: needs an even head_dim, got {self.head_dim}")
        _positive_float("rope_base", self.rope_base)
        params = self.approx_params()
        if params > MAX_PARAMS:
            raise AttnlabError(f"n_layer, n_embd, vocab_size: the model would have about "
                               f"{params:,} parameters ({self.n_layer} layers of n_embd "
                               f"{self.n_embd}, vocab_size {self.vocab_size}); the limit is "
                               f"{MAX_PARAMS:,}")

    def approx_params(self) -> int:
        """About how many parameters the GPT has (embeddings and every layer's matrices)."""
        E = self.n_embd
        per_layer = 2 * E * E + 2 * E * self.n_kv_head * self.head_dim  # q, out; k, v
        if not self.attn_only:
            per_layer += 8 * E * E  # the MLP: E -> 4E -> E
        return (self.vocab_size + self.block_size) * E + self.n_layer * per_layer

    @classmethod
    def from_name(cls, name: str, **overrides) -> GPTConfig:
        return cls(**{**_preset(name)["model"], "name": name,
                      **_known(cls, overrides, "model config")})

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("head_dim")  # derived
        return d

    @classmethod
    def from_dict(cls, d: dict) -> GPTConfig:
        return cls(**_known(cls, d, "model config"))


@dataclass
class TrainConfig:
    """Optimisation settings: AdamW, linear warm-up then cosine decay to min_lr, grad clipping."""

    max_steps: int = 600
    batch_size: int = 16
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 40
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_interval: int = 100
    eval_batches: int = 8
    seed: int = 1337
    corpus: str = "shakespeare"
    val_fraction: float = 0.1
    #: the share of training windows made of a stretch of their text repeated to fill them
    #: (`attnlab.models.repeats`); validation windows stay plain corpus text
    repeat_prob: float = 0.0

    def __post_init__(self):
        for f in ("max_steps", "batch_size", "eval_interval", "eval_batches"):
            _bounded(f, check_positive_int(f, getattr(self, f)))
        w = self.warmup_steps
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise AttnlabError(f"warmup_steps: expected an integer >= 0, got {w!r}")
        _bounded("warmup_steps", w)
        s = self.seed
        if isinstance(s, bool) or not isinstance(s, int) or not -MAX_SEED < s < MAX_SEED:
            raise AttnlabError(f"seed: expected an integer of magnitude below 2**40, got "
                               f"{s!r:.40}")
        for f in ("lr", "min_lr", "grad_clip", "weight_decay", "beta1", "beta2", "val_fraction",
                  "repeat_prob"):
            _finite(f, getattr(self, f))
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise AttnlabError(f"beta1, beta2: expected numbers in [0, 1), got {self.beta1}, "
                               f"{self.beta2}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise AttnlabError(f"weight_decay, grad_clip: expected numbers >= 0, got "
                               f"{self.weight_decay}, {self.grad_clip}")
        if not isinstance(self.corpus, str):
            raise AttnlabError(f"corpus: expected a name, got {self.corpus!r:.40}")
        if self.lr > MAX_LR:
            raise AttnlabError(f"lr: {self.lr:g} is beyond the limit of {MAX_LR:g}")
        if self.weight_decay > 1000:  # lr x weight_decay stays inside float32 too
            raise AttnlabError(f"weight_decay: {self.weight_decay:g} is beyond the limit of 1000")
        if not 0 < self.min_lr <= self.lr:
            raise AttnlabError(f"lr, min_lr: expected 0 < min_lr <= lr, got {self.lr}, "
                               f"{self.min_lr}")
        if isinstance(self.repeat_prob, bool) or not 0 <= self.repeat_prob <= 1:
            raise AttnlabError(f"repeat_prob: expected a probability in [0, 1], got "
                               f"{self.repeat_prob!r}")
        if not 0 < self.val_fraction < 1:
            raise AttnlabError(f"val_fraction: expected a number in (0, 1), got "
                               f"{self.val_fraction!r}")

    @classmethod
    def from_name(cls, name: str, **overrides) -> TrainConfig:
        return cls(**{**_preset(name)["train"], **_known(cls, overrides, "train config")})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        return cls(**_known(cls, d, "train config"))


def _bounded(name: str, value: int) -> int:
    if value > LIMITS[name]:
        raise AttnlabError(f"{name}: {value:.3g} is beyond the limit of {LIMITS[name]:,}")
    return value


def _finite(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AttnlabError(f"{name}: expected a finite number, got {value!r:.40}")
    return value


def _positive_float(name: str, value) -> float:
    if _finite(name, value) <= 0:
        raise AttnlabError(f"{name}: expected a number > 0, got {value!r}")
    return value


def _known(cls, d: dict, what: str) -> dict:
    names = {f.name for f in fields(cls) if f.init}
    unknown = sorted(set(d) - names)
    if unknown:
        raise AttnlabError(f"{what}: unknown fields {unknown}")
    return dict(d)
