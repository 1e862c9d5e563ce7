"""The two lessons attnlab follows, by title, with what each teaches: the README, the docs,
`attnlab lesson` and the explorable page name them from here.

1. *Attention Mechanisms: First Intuition* — the idea without math;
2. *Attention Mechanisms: Why the Math Looks Like This* — why each piece of the formula is there.

Past them, attnlab's own sections carry the same arithmetic from one head to the whole attention
layer of a real model (`attnlab lesson --section layer`).
"""

from __future__ import annotations

FIRST = "Attention Mechanisms: First Intuition"
MATH = "Attention Mechanisms: Why the Math Looks Like This"

#: (title, what it teaches), in reading order
LESSONS = (
    (FIRST, "the idea without math: a word looks at the other words, turns how useful each is "
            "into percentages, and borrows from them; query, key and value; no peeking ahead "
            "(the causal mask); several heads at once"),
    (MATH, "why the math looks like it does: the dot product as a match score, softmax for "
           "positive weights that sum to 1, the weighted sum of values, and scaling by 1/√d"),
)


def lessons_intro() -> list[str]:
    """The two lessons as lines of text: '1. "TITLE": teaches ...'."""
    return [f'{i}. "{title}": {what}.' for i, (title, what) in enumerate(LESSONS, 1)]
