"""What an intervention changed, as numbers: one function per measure, each over a batch of runs
(the rows of a `sweep`, or one run), returned as float64 (B,).

Causal language models, from logits (B, L, V):
    next_token_logprob(logits, token, position)   log p(token | tokens up to position)
                                                   = log_softmax(logits[:, position])[token]
    logit_difference(logits, a, b, position)      logits[:, position, a] - logits[:, position, b]
    text_loss(logits, ids, start, end)             mean over targets t in [start, end) of
                                                   -log p(ids[t] | ids[..t-1]) (from logits[:, t-1])
Encoders, from final hidden states (B, L, C):
    token_cosine(hidden, reference, position)      cos(hidden[:, position], reference[position])
    mean_pool(hidden, attention_mask)              Σ_i m_i h_i / Σ_i m_i (sentence-transformers'
                                                   pooling for all-MiniLM-L6-v2)
    embedding_similarity(a, b)                     cos(mean_pool(a), mean_pool(b)), row by row
"""

from __future__ import annotations

import torch

from attnlab.errors import AttnlabError, fmt_shape


def _rows(x: torch.Tensor, name: str, ndim: int = 3) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != ndim:
        got = fmt_shape(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise AttnlabError(f"{name}: expected a ({'B, L, V' if ndim == 3 else 'L, C'}) tensor, "
                           f"got {got}")
    return x.detach().double()


def _position(position: int, L: int) -> int:
    if isinstance(position, bool) or not isinstance(position, int) or not -L <= position < L:
        raise AttnlabError(f"position: expected an index in 0..{L - 1}, got {position!r}")
    return position % L


def next_token_logprob(logits, token: int, position: int = -1) -> torch.Tensor:
    """(B,): the log-probability each row gives `token` after the tokens up to `position`."""
    x = _rows(logits, "logits")
    return x[:, _position(position, x.shape[1])].log_softmax(-1)[:, int(token)]


def logit_difference(logits, a: int, b: int, position: int = -1) -> torch.Tensor:
    """(B,): logit of answer `a` minus logit of answer `b` after the tokens up to `position`."""
    x = _rows(logits, "logits")
    row = x[:, _position(position, x.shape[1])]  # (B, V)
    return row[:, int(a)] - row[:, int(b)]


def text_loss(logits, ids, start: int = 1, end: int | None = None) -> torch.Tensor:
    """(B,): mean next-token cross-entropy over the target positions t in [start, end) of the
    text `ids` (L,), each predicted from logits[:, t - 1]. start >= 1 (token 0 has no
    prediction); end defaults to L."""
    x = _rows(logits, "logits")
    ids = torch.as_tensor(ids).reshape(-1)
    L = x.shape[1]
    end = L if end is None else end
    if ids.shape[0] != L or not 1 <= start < end <= L:
        raise AttnlabError(f"start, end: expected 1 <= start < end <= {L} for {ids.shape[0]} "
                           f"ids, got start={start}, end={end}")
    lp = x[:, start - 1:end - 1].log_softmax(-1)  # (B, T, V): predictions of targets start..end-1
    targets = ids[start:end].to(lp.device)  # (T,)
    return -lp.gather(-1, targets.expand(lp.shape[0], -1)[..., None])[..., 0].mean(-1)


def token_cosine(hidden, reference, position: int) -> torch.Tensor:
    """(B,): cosine of each row's final representation of the token at `position` to
    `reference` (L, C), the unedited run's."""
    h = _rows(hidden, "hidden")
    ref = _rows(reference, "reference", ndim=2)
    p = _position(position, h.shape[1])
    return torch.nn.functional.cosine_similarity(h[:, p], ref[p][None], dim=-1)


def mean_pool(hidden, attention_mask=None) -> torch.Tensor:
    """(B, C): the mean of each row's token representations over its real tokens."""
    h = _rows(hidden, "hidden")
    if attention_mask is None:
        return h.mean(1)
    m = torch.as_tensor(attention_mask).to(h)  # (B|1, L)
    m = m.expand(h.shape[0], -1)[..., None]  # (B, L, 1)
    return (h * m).sum(1) / m.sum(1).clamp(min=1.0)


def embedding_similarity(hidden_a, hidden_b, mask_a=None, mask_b=None) -> torch.Tensor:
    """(B,): cosine of the two sentences' mean-pooled embeddings, row by row (a row of one
    broadcasts)."""
    a, b = mean_pool(hidden_a, mask_a), mean_pool(hidden_b, mask_b)
    return torch.nn.functional.cosine_similarity(a, b, dim=-1)
