"""Text generation: prefill the prompt into a KV cache, then decode one token at a time.

Sampling draws from a private torch.Generator seeded with `seed`, so the same seed gives the same
text and the global RNG is left alone. Caution: with learned positions the context is at most
block_size tokens; when the cache is full, generation keeps the last block_size // 2 tokens and
prefills them again (a sliding window, recomputed every block_size // 2 tokens).
"""

from __future__ import annotations

import math
import numbers

import torch

from attnlab.errors import AttnlabError

#: the most tokens one call generates (the ids are kept in a list and printed at the end)
MAX_NEW_TOKENS = 1_000_000


def _check(max_new_tokens, temperature, top_k, seed):
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or \
            not 0 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise AttnlabError(f"max_new_tokens: expected an int in [0, {MAX_NEW_TOKENS:,}], got "
                           f"{max_new_tokens!r:.40}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
            math.isfinite(temperature) and temperature >= 0):
        raise AttnlabError(f"temperature: expected a finite number >= 0 (0 = greedy), got "
                           f"{temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise AttnlabError(f"top_k: expected a positive int or None, got {top_k!r:.40}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)
                             or not -(1 << 63) <= int(seed) < 1 << 63):
        raise AttnlabError(f"seed: expected an int of magnitude below 2**63, got {seed!r:.40}")


def next_token(logits: torch.Tensor, temperature: float, top_k: int | None,
               generator: torch.Generator) -> int:
    """Sample one id from logits (V,): greedy at temperature 0, else softmax(logits / T) over the
    top_k most likely ids."""
    if temperature == 0:
        return int(logits.argmax())
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def generate(model, ids: list[int], max_new_tokens: int = 200, *, temperature: float = 1.0,
             top_k: int | None = None, seed: int | None = 0) -> list[int]:
    """The prompt ids followed by up to max_new_tokens sampled ids (a GPT, batch of one)."""
    _check(max_new_tokens, temperature, top_k, seed)
    if not ids:
        raise AttnlabError("prompt: expected at least one token, got an empty prompt")
    model.eval()
    g = torch.Generator()
    g.manual_seed(0 if seed is None else int(seed))
    block = model.config.block_size
    out = list(ids)
    caches = model.new_caches(1, block)
    pending = out[-block:]  # tokens to feed before the next prediction
    for _ in range(max_new_tokens):
        if caches[0].length + len(pending) > block:  # full: slide the window
            for c in caches:
                c.reset()
            pending = out[-(block // 2):]
        logits, _ = model(torch.tensor([pending]), caches=caches)  # (1, len(pending), V)
        tok = next_token(logits[0, -1], temperature, top_k, g)
        out.append(tok)
        pending = [tok]
    return out
