"""The lessons' worked example, computed by attnlab (never typed in).

The lesson's query for "it" is [2, 1]; the keys are cat [3, 1], mat [0, 4], because [1, 1]. The
lesson leaves the value vectors to the imagination; here each value says how much of two kinds of
information a token carries: cat [1, 0] ("a creature"), mat [0, 1] ("a place"), because
[0.5, 0.5] (a bit of both).

Each `section_*` function returns plain data (lists, floats, strings) so the CLI can print it as
text or JSON; `build_lesson` returns all sections in order.
"""

from __future__ import annotations

import numpy as np

from attnlab.masks import causal
from attnlab.trace import Trace, trace

QUERY_TOKEN = "it"
QUERY = [2.0, 1.0]
KEY_TOKENS = ["cat", "mat", "because"]
KEYS = [[3.0, 1.0], [0.0, 4.0], [1.0, 1.0]]
VALUES = [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]
VALUE_MEANING = ["a creature", "a place"]
NEGATIVE_SCORES = [5.0, -2.0, 1.0]  # scores where plain division goes wrong
CAUSAL_TOKENS = ["The", "cat", "sat", "on"]


def lesson_trace(scale: float | None = 1.0) -> Trace:
    """The "it" query against cat/mat/because; scale=1.0 is the lesson's unscaled version."""
    return trace([QUERY], KEYS, VALUES, scale=scale, tokens=KEY_TOKENS, query_tokens=[QUERY_TOKEN])


def _num(x: float) -> str:
    return f"{x:g}"


def section_compare() -> dict:
    t = lesson_trace()
    rows = []
    for tok, key, score in zip(KEY_TOKENS, KEYS, t.scores[0]):
        terms = " + ".join(f"{_num(a)}*{_num(b)}" for a, b in zip(QUERY, key))
        rows.append({"token": tok, "key": key, "arithmetic": f"{terms} = {_num(score)}",
                     "score": float(score)})
    best = KEY_TOKENS[int(np.argmax(t.scores[0]))]
    return {"name": "compare", "title": "Compare: the query for \"it\" against every key",
            "query_token": QUERY_TOKEN, "query": QUERY, "rows": rows, "best_match": best}


def section_divide() -> dict:
    s = np.asarray(NEGATIVE_SCORES)
    divided = s / s.sum()
    soft = trace([[1.0]], [[x] for x in NEGATIVE_SCORES], [[0.0]] * 3, scale=1.0).weights[0]
    return {"name": "divide", "title": "Why not just divide by the total?",
            "scores": s.tolist(), "total": float(s.sum()), "divided": divided.tolist(),
            "softmax": soft.tolist(),
            "problem": "dividing by the total gives a negative weight and one above 100%",
            "has_negative": bool((divided < 0).any())}


def section_softmax() -> dict:
    raw, scaled = lesson_trace(scale=1.0), lesson_trace(scale=None)
    return {"name": "softmax", "title": "Softmax: scores become percentages",
            "tokens": KEY_TOKENS, "scores": raw.scores[0].tolist(),
            "weights": raw.weights[0].tolist(), "sum": float(raw.weights[0].sum()),
            "scale": scaled.scale, "head_dim": len(QUERY),
            "scaled_scores": scaled.scaled_scores[0].tolist(),
            "scaled_weights": scaled.weights[0].tolist()}


def section_borrow() -> dict:
    t = lesson_trace(scale=None)
    w = t.weights[0]
    shares = [{"token": tok, "weight": float(wi), "value": v,
               "contribution": (wi * np.asarray(v)).tolist()}
              for tok, wi, v in zip(KEY_TOKENS, w, VALUES)]
    return {"name": "borrow", "title": "Borrow: the weighted sum of values is the context vector",
            "value_meaning": VALUE_MEANING, "shares": shares,
            "context": t.output[0].tolist(), "scale": t.scale}


def section_causal() -> dict:
    n = len(CAUSAL_TOKENS)
    allowed = causal().to_dense(n, n)[0, 0]  # (L, S)
    # one shared key per token, so only the mask changes the weights
    keys = np.linspace(0.0, 1.5, n)[:, None]
    t = trace(np.ones((n, 1)), keys, np.eye(n), mask=causal(), scale=1.0, tokens=CAUSAL_TOKENS)
    return {"name": "causal", "title": "Causal mask: no peeking ahead",
            "tokens": CAUSAL_TOKENS, "allowed": allowed.tolist(),
            "sees": [[CAUSAL_TOKENS[j] for j in range(n) if allowed[i, j]] for i in range(n)],
            "weights": t.weights.tolist()}


SECTIONS = {
    "compare": section_compare,
    "divide": section_divide,
    "softmax": section_softmax,
    "borrow": section_borrow,
    "causal": section_causal,
}


def build_lesson(sections=None) -> list[dict]:
    """The lesson's sections as data, in order (all of them, or the named ones)."""
    return [SECTIONS[name]() for name in (sections or SECTIONS)]
