"""The lesson as one explorable, offline HTML page: the worked example with every number live.

Seven sections in the lessons' order (compare, normalize, scale, borrow, mask, heads, check
yourself). The starting numbers come from `attnlab.explain.lesson_sections`, so the page opens on
exactly what `attnlab lesson` prints; from there the page's script recomputes attention in float64
as the reader drags and types (the browser tests hold it to `attnlab.trace` within 1e-9).

Same rules as the view page (`attnlab.viz.page`): script, style and data inline, a
Content-Security-Policy that allows only the script's SHA-256 and no requests at all
(`connect-src 'none'`, also when `attnlab serve` serves it at /lesson), every text written as text.
`window.attnlabLesson` has `get()` and `set(partial)` for tests and for readers at the console.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.errors import AttnlabError
from attnlab.explain.lesson_layer import EPS, POSITIONS, W_O, W_V
from attnlab.explain.lesson_records import Check
from attnlab.explain.lesson_sections import CAUSAL_TOKENS, build_lesson
from attnlab.viz.html_doc import asset, document, policy
from attnlab.viz.iframe import NotebookPage

# How each check-yourself question is answered by interacting: a question to try first (choices,
# the first one listed right), and where it has one, a task on the page whose success also opens the
# answer. Keyed by the lesson's question; `lesson_data` refuses a question without an entry.
TRIES = {
    "Why does the word it need attention in the cat example?": {
        "try": "Which word should \u201cit\u201d borrow most from?",
        "choices": ["cat", "mat", "because"],
        "task": "best_is_mat",
        "task_text": "In Compare, drag the query until \u201cmat\u201d is the best match.",
    },
    "What are attention weights like in plain language?": {
        "try": "The weights of one token are\u2026",
        "choices": ["percentages of focus that add up to 100%", "how long each word is",
                    "a yes or no for each word"],
    },
    "What is a context vector?": {
        "try": "The context vector of \u201cit\u201d is\u2026",
        "choices": ["\u201cit\u201d after borrowing from the other tokens",
                    "the list of all keys", "the key with the highest score"],
    },
    "What do query, key, and value mean?": {
        "try": "Match each card: query / key / value =\u2026",
        "choices": ["what I look for / what I can be matched by / what I can give",
                    "the answer / the question / the score",
                    "three names for one and the same vector"],
    },
    "What does causal masking prevent?": {
        "try": "With the causal mask on, \u201ccat\u201d may not look at\u2026",
        "choices": ["\u201csat\u201d and \u201con\u201d (they come later)",
                    "\u201cThe\u201d (it comes earlier)", "itself"],
        "task": "clicked_hidden",
        "task_text": "In Mask, click a hidden cell to see why.",
    },
    "What is multi-head attention?": {
        "try": "In Heads, the two heads differ only in\u2026",
        "choices": ["their projections W_q and W_k", "the sentence", "the softmax"],
        "task": "heads_edited",
        "task_text": "In Heads, change a number of a W_q or W_k and watch that head's focus move.",
    },
    "If two vectors point in a similar direction, should their dot product be high or low?": {
        "try": "Query and key point the same way: the score is\u2026",
        "choices": ["high", "low", "always zero"],
        "task": "away_from_cat",
        "task_text": "In Compare, drag the query to point away from cat: what happens to its "
                     "score?",
    },
    "Why should attention weights add up to 1?": {
        "try": "Weights that sum to 1 make the context vector\u2026",
        "choices": ["a recipe: one full unit of attention split across tokens",
                    "longer with every token", "equal to the best value"],
    },
    "Which pair decides the score: query-key, query-value, or key-value?": {
        "try": "The score is decided by\u2026",
        "choices": ["query\u2013key", "query\u2013value", "key\u2013value"],
        "task": "values_edited",
        "task_text": "In Compare, change a value: do the scores or weights move?",
    },
    "What does softmax do to raw attention scores?": {
        "try": "Softmax turns scores into weights that are\u2026",
        "choices": ["positive and sum to 1, bigger scores getting more",
                    "the scores divided by their total", "all equal"],
        "task": "tried_softmax",
        "task_text": "In Normalize, switch the example (5, \u22122, 1) to softmax.",
    },
    "What gets mixed to create the context vector?": {
        "try": "The weighted sum is taken over\u2026",
        "choices": ["the value vectors", "the key vectors", "the scores"],
    },
    "Why are scores scaled before softmax?": {
        "try": "Without \u00f7\u221ad, as vectors get longer softmax becomes\u2026",
        "choices": ["too confident: one weight near 100%", "more evenly spread",
                    "negative"],
        "task": "big_d",
        "task_text": "In Scale, slide d up to 256 or more and compare the top weights.",
    },
}


def _grid() -> dict:
    """The causal section's vectors: one shared query, keys rising along the sentence (as in
    `attnlab.explain.lesson_sections.section_mask`), one-hot values."""
    n = len(CAUSAL_TOKENS)
    return {"tokens": list(CAUSAL_TOKENS), "queries": np.ones((n, 1)).tolist(),
            "keys": np.linspace(0.0, 1.5, n)[:, None].tolist(), "values": np.eye(n).tolist()}


def _questions(check: Check) -> list[dict]:
    out = []
    for q in check.questions:
        how = TRIES.get(q.question)
        if how is None:
            raise AttnlabError(f"check: no way to try the question {q.question!r} on the page")
        out.append({"lesson": q.lesson, "question": q.question, "answer": q.answer,
                    "try": how["try"], "choices": how["choices"],
                    "task": how.get("task"), "task_text": how.get("task_text")})
    return out


def lesson_data() -> dict:
    """The page's starting numbers and texts, all from `attnlab.explain.lesson_sections`
    (JSON-ready)."""
    s = {x.name: x for x in build_lesson()}
    cmp_, borrow, heads = s["compare"], s["borrow"], s["heads"]
    return {
        "version": 1,
        "query_token": cmp_.query_token, "query": cmp_.query,
        "tokens": [r.token for r in cmp_.rows], "keys": [r.key for r in cmp_.rows],
        "values": [sh.value for sh in borrow.shares],
        "value_meaning": borrow.value_meaning,
        "negative_scores": s["normalize"].scores,
        "grid": _grid(),
        "heads": {"tokens": heads.tokens, "features": heads.features,
                  "embeddings": heads.embeddings, "query_token": heads.query_token,
                  "heads": [{"name": h.name, "looks_for": h.looks_for, "w_q": h.w_q,
                             "w_k": h.w_k, "w_v": W_V[h.name]} for h in heads.heads]},
        "layer": {"w_o": W_O, "eps": EPS},
        "positions": POSITIONS,
        "questions": _questions(s["check"]),
    }


def lesson_csp() -> str:
    """The page's policy: exactly its inline script, inline style, and no requests of any kind."""
    return policy(asset("lesson.js"))


def lesson_html() -> str:
    """The whole page as one string."""
    return document(title="attnlab: attention, explorable", css=asset("lesson.css"),
                    js=asset("lesson.js"), body=asset("lesson.html"),
                    data=("lesson-data", lesson_data()))


def write_lesson_page(path) -> Path:
    """Write the page to `path` (UTF-8); returns the path."""
    path = Path(path)
    path.write_text(lesson_html(), encoding="utf-8")
    return path


class LessonPage(NotebookPage):
    """The page for Jupyter: shown in a sandboxed iframe; `.data` (also `.html`) is the page,
    `.save(path)` writes it."""

    title = "attnlab: the attention lesson, explorable"

    def __init__(self, height: int = 900):
        super().__init__(lesson_html(), height)

    @property
    def html(self) -> str:
        return self.data

