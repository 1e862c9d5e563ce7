"""What each head matters for: every single-head ablation (or patch) of one text in one batched
pass, as a `HeadEffects` record that the terminal, JSON and the effects page show.

    >>> fx = ablation_effects("The cat sat on the mat because it was tired.", loaded, token="it")
    >>> fx.effect.shape             # (layers, H): the measure with the head ablated - without

Measures (`MEASURES`), per model kind:
- causal LMs: `logprob` (default): log p(token | the tokens before it), for the --token (default:
  the last token); `logit-diff`: logit of answer A minus answer B after the whole text; `loss`:
  the mean next-token loss over the text;
- encoders: `cosine` (default): cos(the token's final representation, the unablated one);
  `similarity`: cos of the mean-pooled embeddings of the text and `other` (both ablated alike).
Patching (`patch_effects`) runs CORRUPT with each head's z taken from the CLEAN run and reports
the share of the measure's gap it closes: (patched - corrupt) / (clean - corrupt).
Caution: an effect near 0 does not mean a head is unused: another head can make up for it
(redundancy), and a zero z is a value the model never saw (mean ablation is gentler).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from attnlab.capture import ModelAttention
from attnlab.errors import AttnlabError
from attnlab.explain.model import LoadedModel, run_model
from attnlab.explain.subject import Subject, subject
from attnlab.explain.token import find_word
from attnlab.interventions import HeadOutputs, model_heads, record_heads, sweep
from attnlab.interventions import measures as m
from attnlab.interventions.lens import logit_lens

MEASURES = {"causal": ("logprob", "logit-diff", "loss"), "encoder": ("cosine", "similarity")}


@dataclass
class HeadEffects:
    """effect (layers, H): the measure with each head edited minus without (ablation), or the
    share of the clean-corrupt gap each head's patch closes (patching). `values` (layers, H) are
    the edited runs' measures; `baseline` the unedited run's (for patching: the corrupt run's,
    `clean` the clean run's). `position` is the token the measure reads (None: the whole text)."""

    kind: str
    model_name: str
    causal: bool
    tokens: list[str]
    measure: str
    what: str
    position: int | None
    baseline: float
    values: np.ndarray
    effect: np.ndarray
    attention: ModelAttention
    clean: float | None = None
    other: str | None = None
    texts: list[str] = field(default_factory=list)
    how: str = "zero"
    lens: dict | None = None

    def to_json(self) -> dict:
        return {
            "kind": self.kind, "model": self.model_name, "causal": self.causal,
            "texts": self.texts, "tokens": self.tokens, "measure": self.measure,
            "what": self.what, "position": self.position, "how": self.how,
            "baseline": self.baseline, "clean": self.clean, "other": self.other,
            "values": np.round(self.values, 6).tolist(),
            "effect": np.round(self.effect, 6).tolist(),
            "lens": self.lens,
        }

    def top(self, k: int = 5) -> list[tuple[int, int, float]]:
        """The k heads of largest |effect|: (layer, head, effect)."""
        order = np.argsort(-np.abs(self.effect), axis=None, kind="stable")[:k]
        H = self.effect.shape[1]
        return [(int(i) // H, int(i) % H, float(self.effect.flat[i])) for i in order]


def _check_measure(s: Subject, measure: str | None) -> str:
    kind = "causal" if s.causal else "encoder"
    measure = measure or MEASURES[kind][0]
    if measure not in MEASURES[kind]:
        raise AttnlabError(f"--measure {measure!r}: a {kind} model measures "
                           f"{', '.join(MEASURES[kind])}")
    return measure


def _position(tokens: list[str], token: str | None, causal: bool, special) -> int:
    if token is None:  # the last token that is not [SEP] or another special token
        real = [i for i, t in enumerate(tokens) if t not in special]
        return real[-1] if real else len(tokens) - 1
    pieces = find_word(tokens, token)
    if causal and pieces[0] == 0:
        raise AttnlabError(f"--token {token!r}: the first token has no prediction to measure; "
                           "pick a later one")
    return pieces[0]


class _Reader:
    """One measure as a function of a forward's output (B, L, V|C) -> (B,)."""

    def __init__(self, s: Subject, measure: str, ids, position, answers, ref):
        self.s, self.measure, self.ids, self.position = s, measure, ids, position
        self.answers, self.ref = answers, ref

    def __call__(self, out: torch.Tensor, other_out: torch.Tensor | None = None) -> torch.Tensor:
        if self.measure == "logprob":
            return m.next_token_logprob(out, self.ids[self.position], self.position - 1)
        if self.measure == "logit-diff":
            return m.logit_difference(out, *self.answers)
        if self.measure == "loss":
            return m.text_loss(out, self.ids)
        if self.measure == "cosine":
            return m.token_cosine(out, self.ref, self.position)
        return m.embedding_similarity(out, other_out)


def _describe(measure: str, tokens, position, answers_text, other) -> str:
    tok = tokens[position] if position is not None else ""
    return {
        "logprob": f"log p({tok!r} | the tokens before it)",
        "logit-diff": (f"logit of {answers_text[0]!r} minus {answers_text[1]!r} after the text"
                       if answers_text else ""),
        "loss": "mean next-token loss over the text",
        "cosine": f"cosine of {tok!r}'s final representation to the unablated one",
        "similarity": f"cosine of the mean-pooled embeddings of the text and {other!r}",
    }[measure]


def _answers(s: Subject, answers) -> tuple[int, int] | None:
    if answers is None:
        return None
    if len(answers) != 2:
        raise AttnlabError(f"--answers: expected two answers A B, got {list(answers)}")
    return s.token_id(answers[0]), s.token_id(answers[1])


def _mean_values(s: Subject, mean_of) -> HeadOutputs | None:
    if not mean_of:
        return None
    runs = []
    for text in mean_of:
        inputs, _, _ = s.encode(text)
        with torch.no_grad(), record_heads(s.model) as rec:
            s.forward(inputs)
        runs.append(rec)
    return HeadOutputs.average(runs)


@torch.no_grad()
def ablation_effects(text: str, loaded: LoadedModel, *, token: str | None = None,
                     measure: str | None = None, answers=None, other: str | None = None,
                     mean_of: list[str] | None = None, lens: bool = True) -> HeadEffects:
    """Every head of `loaded` ablated on `text`, one at a time, in one batched pass (zero
    ablation, or the head's mean z over the texts `mean_of`)."""
    s = subject(loaded)
    measure = _check_measure(s, measure)
    if measure == "logit-diff" and answers is None:
        raise AttnlabError("--answers: the logit-diff measure needs two answers A B")
    if measure == "similarity" and not other:
        raise AttnlabError("--other: the similarity measure needs a second text")
    n_layers, n_heads = model_heads(s.model)
    inputs, ids, tokens = s.encode(text)
    position = None if measure in ("loss", "logit-diff", "similarity") else \
        _position(tokens, token, s.causal, loaded.special_tokens)
    values = _mean_values(s, mean_of)
    out, rows = sweep(s.model, lambda: s.forward(inputs), values=values)
    ids_answers = _answers(s, answers)
    read = _Reader(s, measure, ids, position, ids_answers, out[0])
    if measure == "similarity":
        o_inputs, _, _ = s.encode(other)
        o_out, _ = sweep(s.model, lambda: s.forward(o_inputs), values=None)
        got = read(out, o_out)
    else:
        got = read(out)
    grid = _grid(got[1:], rows, n_layers, n_heads)
    base = float(got[0])
    return HeadEffects(
        kind="ablate", model_name=s.name, causal=s.causal, tokens=tokens, measure=measure,
        what=_describe(measure, tokens, position, answers, other), position=position,
        baseline=base, values=grid, effect=grid - base, attention=run_model(text, loaded),
        other=other, texts=[text], how="mean" if values is not None else "zero",
        lens=lens_top(s, inputs, tokens) if lens and s.causal else None)


@torch.no_grad()
def patch_effects(clean: str, corrupt: str, loaded: LoadedModel, *, token: str | None = None,
                  answers=None, lens: bool = True) -> HeadEffects:
    """Each head of the CORRUPT run given its z from the CLEAN run, one at a time in one
    batched pass; effect = (patched - corrupt) / (clean - corrupt) of the measure: the logit
    difference of `answers` or the log-prob of the clean run's top next token (causal LMs), the
    cosine of `token`'s final representation to the clean run's (encoders)."""
    s = subject(loaded)
    n_layers, n_heads = model_heads(s.model)
    c_inputs, c_ids, c_tokens = s.encode(clean)
    x_inputs, x_ids, x_tokens = s.encode(corrupt)
    if len(c_ids) != len(x_ids):
        raise AttnlabError(f"CORRUPT: expected as many tokens as CLEAN ({len(c_ids)}: "
                           f"{' '.join(c_tokens)}), got {len(x_ids)}: {' '.join(x_tokens)}")
    with record_heads(s.model) as rec:
        clean_out = s.forward(c_inputs)
    out, rows = sweep(s.model, lambda: s.forward(x_inputs), values=rec)
    position = None
    if s.causal:
        if answers is not None:
            a, b = _answers(s, answers)
            measure, what = "logit-diff", f"logit of {answers[0]!r} minus {answers[1]!r}"
            read = lambda o: m.logit_difference(o, a, b)  # noqa: E731
        else:
            top = int(clean_out[0, -1].argmax())
            measure = "logprob"
            what = f"log p({s.token_text(top)!r}, the clean run's next token)"
            read = lambda o: m.next_token_logprob(o, top)  # noqa: E731
    else:
        position = _position(c_tokens, token, False, loaded.special_tokens)
        measure = "cosine"
        what = f"cosine of {c_tokens[position]!r}'s final representation to the clean run's"
        read = lambda o: m.token_cosine(o, clean_out[0], position)  # noqa: E731
    got = read(out)
    clean_value, corrupt_value = float(read(clean_out)[0]), float(got[0])
    gap = clean_value - corrupt_value
    if abs(gap) < 1e-9:
        raise AttnlabError("CLEAN, CORRUPT: the measure is the same on both texts "
                           f"({clean_value:.4g}); nothing to restore")
    grid = _grid(got[1:], rows, n_layers, n_heads)
    return HeadEffects(
        kind="patch", model_name=s.name, causal=s.causal, tokens=x_tokens, measure=measure,
        what=what, position=position, baseline=corrupt_value, values=grid,
        effect=(grid - corrupt_value) / gap, attention=run_model(corrupt, loaded),
        clean=clean_value, texts=[clean, corrupt], how="patch",
        lens=lens_top(s, x_inputs, x_tokens) if lens and s.causal else None)


def _grid(values: torch.Tensor, rows, n_layers: int, n_heads: int) -> np.ndarray:
    grid = np.full((n_layers, n_heads), np.nan)
    for (layer, head), v in zip(rows, values.tolist()):
        grid[layer, head] = v
    return grid


@torch.no_grad()
def lens_top(s: Subject, inputs: dict, tokens: list[str]) -> dict:
    """The logit lens of one text: at each layer (0 = embeddings) and position, the top next
    token and its probability, and the probability of the token that actually follows."""
    lens = logit_lens(s.model, lambda: s.forward(inputs))[:, 0].double().softmax(-1)
    p, top = lens.max(-1)  # (layers + 1, L)
    ids = (inputs.get("idx") if "idx" in inputs else inputs["input_ids"])[0]
    nxt = torch.full(p.shape, float("nan"), dtype=torch.float64)
    nxt[:, :-1] = lens[:, :-1].gather(-1, ids[1:].expand(lens.shape[0], -1)[..., None])[..., 0]
    vocab = sorted({int(i) for i in top.flatten()})
    names = {i: s.token_text(i) for i in vocab}
    return {
        "top": [[names[int(i)] for i in row] for row in top],
        "p": np.round(p.numpy(), 4).tolist(),
        "p_next": [[None if np.isnan(x) else round(float(x), 4) for x in row]
                   for row in nxt.numpy()],
        "tokens": tokens,
    }


def focus(fx: HeadEffects) -> int:
    """The token whose attention the views show next to the effects: the measured one, else the
    last token that is not special (the whole-text measures)."""
    if fx.position is not None:
        return fx.position
    keep = [i for i, t in enumerate(fx.tokens) if not (t.startswith("[") and t.endswith("]"))]
    return keep[-1] if keep else len(fx.tokens) - 1


def looks_at(fx: HeadEffects) -> tuple[np.ndarray, np.ndarray]:
    """(largest weight (layers, H), its key (layers, H)) of the focus token's row, per head:
    where each head looks, beside what it matters for."""
    w = np.asarray(fx.attention.weights)[:, :, focus(fx)]  # (layers, H, S)
    return w.max(-1), w.argmax(-1)


def effects_payload(fx: HeadEffects) -> dict:
    """The effects page's numbers: the record's JSON, the focus token, each head's weights row
    for it and the steps that made it (scores q·k, scaled, the mask)."""
    att = fx.attention
    f = focus(fx)
    steps = []
    for layer in range(att.n_layers):
        row = []
        for head in range(att.n_heads):
            t = att.head_trace(layer, head)
            row.append({"scores": _r(t.scores[f]), "scaled": _r(t.scaled_scores[f]),
                        "weights": _r(t.weights[f]),
                        "allowed": [bool(x) for x in att.layer_mask(layer)[f]]})
        steps.append(row)
    peak, key = looks_at(fx)
    return {**fx.to_json(), "focus": f, "peak": _r(peak), "key": key.tolist(), "steps": steps}


def _r(a) -> list:
    a = np.asarray(a, dtype=np.float64)
    return np.where(np.isfinite(a), np.round(a, 5), 0.0).tolist()
