"""A head's label in words, with why it got it, or why it got none (`attnlab heads`, the page's
heads view).

    >>> stats = head_stats(run_model("The cat sat on the mat because it was tired."))
    >>> head_words(stats, 0, 2)
    'each token looks at the one before it (prev 1.00 >= 0.5)'
    >>> head_words(stats, 5, 11)   # induction 0.70, but one sentence cannot show it
    'no label: induction 0.70 is not counted, only 1 row of these texts ...'

The labels themselves are `head_statistics.LABEL_RULES`; this module only says them in words.
`focused_unlabelled` lists the heads the rules cannot name although they look hard at one token
(mean largest weight >= 0.5): the ones a reader of one sentence wonders about.
"""

from __future__ import annotations

import math

from attnlab.explain.head_statistics import INDUCTION_MIN_ROWS, LABEL_RULES, HeadStats

#: what each label means, in words; {v} is its statistic
_MEANS = {
    "induction": "looks at the token after an earlier copy of itself (induction {v:.2f} >= {t})",
    "previous-token": "each token looks at the one before it (prev {v:.2f} >= {t})",
    "next-token": "each token looks at the one after it (next {v:.2f} >= {t})",
    "self": "each token looks at itself (self {v:.2f} >= {t})",
    "sink / [CLS]": "parks its attention on the first token, a no-op (first {v:.2f} >= {t})",
    "[SEP]": "parks its attention on [SEP], a no-op (special after position 0 {v:.2f} >= {t})",
    "punctuation": "looks at punctuation (punct {v:.2f} >= {t})",
    "broad": "spreads its attention evenly (entropy_norm {v:.2f} >= {t})",
}
#: a focused head: its mean largest weight at least this
FOCUSED = 0.5


def _value(stats: HeadStats, stat: str, l: int, h: int) -> float:
    if stat == "special_rest":
        return float(stats.extra.get("special_rest", stats["special"])[l, h])
    return float(stats[stat][l, h])


def head_words(stats: HeadStats, l: int, h: int) -> str:
    """Head (l, h)'s label as a sentence with its statistic and threshold, or, without a label,
    what kept each rule from firing and what the head does instead."""
    label = stats.labels[l][h]
    for name, stat, t in LABEL_RULES:
        if name == label:
            return _MEANS[name].format(v=_value(stats, stat, l, h), t=t)
    return "no label: " + "; ".join(why_none(stats, l, h))


def why_none(stats: HeadStats, l: int, h: int) -> list[str]:
    """The reasons head (l, h) has no label: an induction score that too few rows support, its
    focus without a fixed place, and the rule it came nearest to."""
    out = []
    rows = int(stats.extra.get("induction_rows", [0] * stats.n_layers)[l])
    ind = float(stats["induction"][l, h])
    if math.isfinite(ind) and ind >= LABEL_RULES[0][2] and rows < INDUCTION_MIN_ROWS:
        out.append(f"induction {ind:.2f} is not counted, only {rows} row{'s' * (rows != 1)} of "
                   f"these texts {'has' if rows == 1 else 'have'} an earlier copy to follow (a "
                   f"label needs {INDUCTION_MIN_ROWS}; --repeat-random 50 probes it)")
    top, share = float(stats["max"][l, h]), float(stats["offset_share"][l, h])
    if math.isfinite(top) and top >= FOCUSED:
        out.append(f"focused (mean largest weight {top:.2f}) but on no fixed place (its "
                   f"commonest offset: {100 * share:.0f}% of tokens): it picks by content")
    near = None
    for name, stat, t in LABEL_RULES:
        v = _value(stats, stat, l, h)
        if name != "induction" and math.isfinite(v) and (near is None or v / t > near[0]):
            near = (v / t, name, stat, v, t)
    if near is not None:
        _, name, stat, v, t = near
        what = "special after position 0" if stat == "special_rest" else stat
        out.append(f"nearest rule: {name} ({what} {v:.2f} < {t})")
    return out


def focused_unlabelled(stats: HeadStats, k: int = 5) -> list[tuple[int, int]]:
    """Up to `k` heads with no label and a mean largest weight >= FOCUSED, most focused first."""
    pairs = [(l, h) for l, h in stats.ranked("max") if stats.labels[l][h] == "-"
             and float(stats["max"][l, h]) >= FOCUSED]
    return pairs[:k]
