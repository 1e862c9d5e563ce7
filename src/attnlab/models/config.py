"""GPTConfig and TrainConfig: dataclasses with derived fields and named presets.

    >>> cfg = GPTConfig.from_name("tiny", vocab_size=65)
    >>> cfg.head_dim, cfg.n_kv_head
    (24, 4)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from attnlab.errors import AttnlabError, check_dropout, check_positive_int

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
            check_positive_int(f, getattr(self, f))
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
            check_positive_int(f, getattr(self, f))
        if self.warmup_steps < 0:
            raise AttnlabError(f"warmup_steps: expected >= 0, got {self.warmup_steps!r}")
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


def _known(cls, d: dict, what: str) -> dict:
    names = {f.name for f in fields(cls) if f.init}
    unknown = sorted(set(d) - names)
    if unknown:
        raise AttnlabError(f"{what}: unknown fields {unknown}")
    return dict(d)
