"""The induction probe: N random tokens, then the same N again (Olsson et al. 2022).

    >>> att = repeat_random(load_model(None), 50, seed=0)   # [CLS] r1..r50 r1..r50 [SEP]
    >>> head_stats(att)["induction"]                          # the induction score per head

Random tokens are drawn (seeded, without replacement while the vocabulary allows) from the
model's ordinary tokens: special tokens and bracketed placeholders ([unused7]) are never drawn,
and for a checkpoint attnlab trained only the characters that make up most of its corpus (a
character it saw a handful of times has an untrained embedding no head can match); nothing is
put between the two copies; a Hugging Face tokenizer adds its usual framing
([CLS] … [SEP]) around the whole sequence. Runs the model like `run_model` (float64 weights).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from attnlab import models
from attnlab.adapters.recording import record
from attnlab.capture import ModelAttention
from attnlab.errors import AttnlabError
from attnlab.explain.model import LoadedModel, display_tokens
from attnlab.models.checkpoint_checks import parse_doc
from attnlab.models.corpus import load_corpus

#: the probe draws from the characters that make up this share of the training text: a character
#: the model has hardly seen (a digit, "&", "Q") has an untrained embedding no head can match
PROBE_COVERAGE = 0.98


def random_tokens(pool: list[int], n: int, seed: int) -> list[int]:
    """n ids from `pool`, seeded; without replacement when the pool is large enough."""
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(pool), size=n, replace=n > len(pool))
    return [pool[int(k)] for k in picks]


def frequent_ids(data, *, coverage: float = PROBE_COVERAGE, at_least: int = 1) -> list[int]:
    """The most frequent ids of `data` (a 1-D tensor of token ids) that together make up
    `coverage` of it, at least `at_least` of them (fewer only if fewer ids occur), most frequent
    first."""
    counts = torch.bincount(torch.as_tensor(data).flatten())
    order = torch.argsort(counts, descending=True, stable=True)
    share = torch.cumsum(counts[order], 0) / counts.sum()  # share covered by the first k + 1
    k = int((share < coverage).sum()) + 1
    k = min(max(k, at_least), int((counts > 0).sum()))
    return [int(i) for i in order[:k]]


def repeat_random(model: LoadedModel, n: int, *, seed: int = 0) -> ModelAttention:
    """Run `model` on N random tokens followed by the same N; every layer's attention."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise AttnlabError(f"n: expected a positive number of random tokens, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise AttnlabError(f"seed: expected a non-negative whole number (0, 1, 2, ...), got "
                           f"{seed!r}")
    if model.kind == "attnlab":
        return _run_gpt(model, n, seed)
    return _run_hf(model, n, seed)


def _run_gpt(loaded, n: int, seed: int):
    config = loaded.model.config
    if 2 * n > config.block_size:
        raise AttnlabError(f"--repeat-random {n}: 2·{n} tokens exceed {loaded.name}'s block "
                           f"size {config.block_size}")
    seq = random_tokens(_trained_ids(loaded, n), n, seed)
    att = models.capture_attention(loaded.model, seq + seq, loaded.tokenizer)
    att.tokens = [str(i) for i in seq + seq]  # ids: characters such as "\n" print badly
    att.model_name = loaded.name
    return att


def _trained_ids(loaded, n: int) -> list[int]:
    """The ids of the characters that make up most of the corpus the checkpoint was trained on
    (`frequent_ids`, at least n); every id when the checkpoint names no corpus."""
    vocab = loaded.model.config.vocab_size
    try:
        doc = parse_doc(Path(loaded.path))  # bounded, no FIFO, no link out: as the load read it
        corpus = (doc.get("train") or {}).get("corpus")
    except (AttnlabError, AttributeError):
        corpus = None
    if not isinstance(corpus, str):
        return list(range(vocab))
    try:
        ids = loaded.tokenizer.encode(load_corpus(corpus))
    except (AttnlabError, KeyError, ValueError):  # another corpus or tokenizer than it names
        return list(range(vocab))
    return frequent_ids(torch.tensor(ids), at_least=n)


def _framed(tok, body: list[int]) -> list[int]:
    """`body` inside the tokenizer's usual framing: what it adds around a one-word text."""
    plain = tok("a", add_special_tokens=False)["input_ids"]
    full = tok("a")["input_ids"]
    for k in range(len(full) - len(plain) + 1):
        if full[k:k + len(plain)] == plain:
            return full[:k] + body + full[k + len(plain):]
    return body


def _run_hf(loaded, n: int, seed: int):
    tok = loaded.tokenizer
    special = set(tok.all_special_ids)
    pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
    pool = [i for i, p in enumerate(pieces)
            if i not in special and p and not (p.startswith("[") and p.endswith("]"))
            and not (p.startswith("<") and p.endswith(">"))]
    seq = random_tokens(pool, n, seed)
    ids = _framed(tok, seq + seq)
    if loaded.max_length is not None and len(ids) > loaded.max_length:
        raise AttnlabError(f"--repeat-random {n}: {len(ids)} tokens, but {loaded.name} takes at "
                           f"most {loaded.max_length}")
    inputs = torch.tensor([ids])
    with torch.no_grad(), record() as calls:
        loaded.model(input_ids=inputs, attention_mask=torch.ones_like(inputs))
    tokens = display_tokens(tok, ids)
    # statistics compare tokens as strings: keep distinct ids distinct
    seen: dict[str, int] = {}
    for k, (i, t) in enumerate(zip(ids, tokens)):
        if seen.setdefault(t, i) != i:
            tokens[k] = f"{t}#{i}"
    return ModelAttention.from_calls(calls, tokens, model_name=loaded.name)
