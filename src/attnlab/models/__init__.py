"""A small GPT on attnlab.nn: config presets, a character tokenizer, the bundled public-domain
corpus, a resumable trainer, checkpoints, generation and attention capture.

    >>> from attnlab.models import Trainer, load_checkpoint, generate
    >>> Trainer.start("tiny", out="runs/tiny", max_steps=50).run()     # doctest: +SKIP
    >>> model, tok = load_checkpoint("runs/tiny")                      # doctest: +SKIP
    >>> tok.decode(generate(model, tok.encode("ROMEO:"), 100, seed=0))  # doctest: +SKIP
"""

from attnlab.models.checkpoint import is_checkpoint, load_checkpoint, save_checkpoint
from attnlab.models.config import PRESETS, GPTConfig, TrainConfig
from attnlab.models.corpus import corpus_license, load_corpus
from attnlab.models.gpt import GPT
from attnlab.models.gpt_attention import capture_attention
from attnlab.models.sampling import generate
from attnlab.models.schedule import lr_at
from attnlab.models.tokenizer import CharTokenizer, tokenizer_from_spec
from attnlab.models.trainer import Trainer

__all__ = [
    "GPT",
    "PRESETS",
    "CharTokenizer",
    "GPTConfig",
    "TrainConfig",
    "Trainer",
    "capture_attention",
    "corpus_license",
    "generate",
    "is_checkpoint",
    "load_checkpoint",
    "load_corpus",
    "lr_at",
    "save_checkpoint",
    "tokenizer_from_spec",
]
