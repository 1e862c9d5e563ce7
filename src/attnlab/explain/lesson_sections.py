"""The lessons' worked example, computed by attnlab (never typed in).

The lesson's query for "it" is [2, 1]; the keys are cat [3, 1], mat [0, 4], because [1, 1]. The
lesson leaves the value vectors to the imagination; here each value says how much of two kinds of
information a token carries: cat [1, 0] ("a creature"), mat [0, 1] ("a place"), because
[0.5, 0.5] (a bit of both).

The sections are the lesson's steps, named as everywhere in attnlab (code, CLI, JSON, pages):
compare (query · key), normalize (why softmax and not division by the total), scale (softmax with
and without 1/sqrt(d)), borrow (the weighted sum of values), mask (causal), then heads (two heads
at once) and check (the lessons' questions answered). Each `section_*` function returns its
section as a record (`attnlab.explain.lesson_records`), which the terminal text, `--json`
(`to_json()`) and the lesson page read; `build_lesson` returns all sections in the lesson's order.
"""

from __future__ import annotations

import numpy as np

from attnlab.explain.lesson_check import section_check
from attnlab.explain.lesson_records import (
    Borrow,
    Compare,
    CompareRow,
    HeadExample,
    Heads,
    Mask,
    Normalize,
    Scale,
    Section,
    Share,
)
from attnlab.masks import causal
from attnlab.tracing import Trace, trace

QUERY_TOKEN = "it"
QUERY = [2.0, 1.0]
KEY_TOKENS = ["cat", "mat", "because"]
KEYS = [[3.0, 1.0], [0.0, 4.0], [1.0, 1.0]]
VALUES = [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]
VALUE_MEANING = ["a creature", "a place"]
NEGATIVE_SCORES = [5.0, -2.0, 1.0]  # scores where plain division goes wrong
CAUSAL_TOKENS = ["The", "cat", "sat", "on"]

# Two heads: every token of the sentence is an embedding with four features; each head has its own
# query/key projection (W_q, W_k: 4 features -> 2 numbers). Only the projections differ, so the two
# heads find different things in the same sentence.
HEAD_TOKENS = ["The", "cat", "sat", "on", "the", "mat", "because", "it"]
FEATURES = ["creature", "place", "action", "needs a referent"]
EMBEDDINGS = {  # token -> its four features
    "The": [0, 0, 0, 0], "cat": [1, 0, 0, 0], "sat": [0, 0, 1, 0], "on": [0, 0.5, 0, 0],
    "the": [0, 0, 0, 0], "mat": [0, 1, 0, 0], "because": [0, 0, 0, 0], "it": [0.2, 0, 0, 1],
}
HEADS = {
    # name: (what it looks for, W_q, W_k); rows are the four features
    "who?": ("a creature the pronoun can stand for",
             [[0, 0], [0, 0], [0, 0], [3, 0]], [[3, 0], [0, 0], [0, 0], [0, 0]]),
    "where?": ("a place",
               [[0, 0], [0, 0], [0, 3], [0, 3]], [[0, 0], [0, 3], [0, 0], [0, 0]]),
}


def lesson_trace(scale: float | None = 1.0) -> Trace:
    """The "it" query against cat/mat/because; scale=1.0 is the lesson's unscaled version."""
    return trace([QUERY], KEYS, VALUES, scale=scale, tokens=KEY_TOKENS, query_tokens=[QUERY_TOKEN])


def _num(x: float) -> str:
    return f"{x:g}"


def section_compare() -> Compare:
    t = lesson_trace()
    rows = []
    for tok, key, score in zip(KEY_TOKENS, KEYS, t.scores[0]):
        terms = " + ".join(f"{_num(a)}*{_num(b)}" for a, b in zip(QUERY, key))
        rows.append(CompareRow(token=tok, key=key, arithmetic=f"{terms} = {_num(score)}",
                               score=float(score)))
    best = KEY_TOKENS[int(np.argmax(t.scores[0]))]
    return Compare(title="Compare: the query for \"it\" against every key",
                   query_token=QUERY_TOKEN, query=QUERY, rows=rows, best_match=best)


def section_normalize() -> Normalize:
    s = np.asarray(NEGATIVE_SCORES)
    divided = s / s.sum()
    soft = trace([[1.0]], [[x] for x in NEGATIVE_SCORES], [[0.0]] * 3, scale=1.0).weights[0]
    return Normalize(title="Normalize: why not just divide by the total?",
                     scores=s.tolist(), total=float(s.sum()), divided=divided.tolist(),
                     softmax=soft.tolist(),
                     problem="dividing by the total gives a negative weight and one above 100%",
                     has_negative=bool((divided < 0).any()))


def section_scale() -> Scale:
    raw, scaled = lesson_trace(scale=1.0), lesson_trace(scale=None)
    return Scale(title="Scale: softmax turns scores into percentages, cooled by 1/sqrt(d)",
                 tokens=KEY_TOKENS, scores=raw.scores[0].tolist(),
                 weights=raw.weights[0].tolist(), sum=float(raw.weights[0].sum()),
                 scale=scaled.scale, head_dim=len(QUERY),
                 scaled_scores=scaled.scaled_scores[0].tolist(),
                 scaled_weights=scaled.weights[0].tolist())


def section_borrow() -> Borrow:
    t = lesson_trace(scale=None)
    w = t.weights[0]
    shares = [Share(token=tok, weight=float(wi), value=v,
                    contribution=(wi * np.asarray(v)).tolist())
              for tok, wi, v in zip(KEY_TOKENS, w, VALUES)]
    return Borrow(title="Borrow: the weighted sum of values is the context vector",
                  value_meaning=VALUE_MEANING, shares=shares, context=t.output[0].tolist(),
                  scale=t.scale)


def section_mask() -> Mask:
    n = len(CAUSAL_TOKENS)
    allowed = causal().to_dense(n, n)[0, 0]  # (L, S)
    # one shared key per token, so only the mask changes the weights
    keys = np.linspace(0.0, 1.5, n)[:, None]
    t = trace(np.ones((n, 1)), keys, np.eye(n), mask=causal(), scale=1.0, tokens=CAUSAL_TOKENS)
    return Mask(title="Mask: the causal mask, no peeking ahead",
                tokens=CAUSAL_TOKENS, allowed=allowed.tolist(),
                sees=[[CAUSAL_TOKENS[j] for j in range(n) if allowed[i, j]] for i in range(n)],
                weights=t.weights.tolist())


def section_heads() -> Heads:
    x = np.array([EMBEDDINGS[t] for t in HEAD_TOKENS], dtype=float)  # (L, 4)
    wq = np.array([HEADS[h][1] for h in HEADS], dtype=float)  # (H, 4, 2)
    wk = np.array([HEADS[h][2] for h in HEADS], dtype=float)
    q, k = x @ wq, x @ wk  # (L, 4) @ (H, 4, 2) -> (H, L, 2)
    v = np.broadcast_to(np.eye(len(HEAD_TOKENS)), (len(HEADS), *[len(HEAD_TOKENS)] * 2))
    t = trace(q, k, v, tokens=HEAD_TOKENS)  # (H, L, S) weights, default 1/sqrt(2) scaling
    i = HEAD_TOKENS.index(QUERY_TOKEN)
    heads = []
    for h, (name, (looks_for, wq_h, wk_h)) in enumerate(HEADS.items()):
        row = t.weights[h, i]
        heads.append(HeadExample(name=name, looks_for=looks_for, w_q=wq_h, w_k=wk_h,
                                 query=q[h, i].tolist(), keys=k[h].tolist(),
                                 scores=t.scores[h, i].tolist(), weights=row.tolist(),
                                 top_token=HEAD_TOKENS[int(np.argmax(row))],
                                 top_weight=float(row.max())))
    return Heads(title="Two heads: different projections, different patterns",
                 tokens=HEAD_TOKENS, features=FEATURES,
                 embeddings=[EMBEDDINGS[tok] for tok in HEAD_TOKENS], query_token=QUERY_TOKEN,
                 scale=t.scale, heads=heads)


SECTIONS = {
    "compare": section_compare,
    "normalize": section_normalize,
    "scale": section_scale,
    "borrow": section_borrow,
    "mask": section_mask,
    "heads": section_heads,
    "check": lambda: section_check({n: fn() for n, fn in SECTIONS.items() if n != "check"}),
}


def build_lesson(sections=None) -> list[Section]:
    """The lesson's sections as records, in order (all of them, or the named ones)."""
    names = list(sections or SECTIONS)
    done = {name: SECTIONS[name]() for name in names if name != "check"}
    if "check" in names:  # answered from the numbers the other sections just computed
        missing = {n: fn() for n, fn in SECTIONS.items() if n not in done and n != "check"}
        done["check"] = section_check({**done, **missing})
    return [done[name] for name in names]
