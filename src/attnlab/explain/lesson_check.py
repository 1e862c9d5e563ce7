"""The lessons' "check yourself" questions, answered with the numbers the lesson just computed.

`section_check` takes the other sections' data (see `attnlab.explain.lesson_sections`) and
computes the few extra numbers an answer needs (a dot product of vectors pointing the same way,
the spread of
scores in 64 dimensions); no answer contains a number typed in by hand.
"""

from __future__ import annotations

import numpy as np

from attnlab.explain.lesson_records import Borrow, Check, Compare, Question, Section
from attnlab.explain.lessons import FIRST, MATH
from attnlab.formats import pct, vec
from attnlab.tracing import trace


def _recipe(tokens, weights) -> str:
    return " + ".join(f"{pct(w, 0)} {t}" for t, w in zip(tokens, weights))


def _direction(query) -> dict:
    q = np.asarray(query, dtype=float)
    pairs = {"same direction": 2 * q, "opposite": -q, "perpendicular": np.array([-q[1], q[0]])}
    return {name: {"vector": v.tolist(), "dot": float(q @ v)} for name, v in pairs.items()}


def _values_do_not_decide(s_compare: Compare, s_borrow: Borrow) -> dict:
    """Weights with the lesson's values, and with every value multiplied by 10 and shuffled."""
    q = [s_compare.query]
    keys = [r.key for r in s_compare.rows]
    values = [sh.value for sh in s_borrow.shares]
    a = trace(q, keys, values).weights[0]
    b = trace(q, keys, (10 * np.asarray(values))[::-1]).weights[0]
    moved = [list(keys[0]), *keys[1:]]
    moved[0] = [-x for x in moved[0]]  # turn the cat key around
    c = trace(q, moved, values).weights[0]
    return {"weights": a.tolist(), "weights_other_values": b.tolist(),
            "max_change_from_values": float(np.abs(a - b).max()),
            "weights_cat_key_reversed": c.tolist()}


def _scaling(dims=(2, 64), samples: int = 4000, seed: int = 0) -> dict:
    """Spread (std) of q·k for random unit-variance vectors, raw and scaled by 1/sqrt(D)."""
    rng = np.random.default_rng(seed)
    out = {}
    for d in dims:
        q, k = rng.standard_normal((2, samples, d))
        raw = (q * k).sum(axis=-1)
        out[d] = {"raw_std": float(raw.std()), "scaled_std": float((raw / np.sqrt(d)).std())}
    # what the spread does to softmax: three keys in 64 dims, top weight raw vs scaled
    q, k = rng.standard_normal((1, 64)), rng.standard_normal((3, 64))
    raw = trace(q, k, np.eye(3), scale=1.0).weights[0]
    scaled = trace(q, k, np.eye(3)).weights[0]
    return {"std": out, "top_weight_raw": float(raw.max()),
            "top_weight_scaled": float(scaled.max())}


def section_check(s: dict[str, Section]) -> Check:
    """Both lessons' check-yourself questions; `s` maps section name -> that section's record."""
    cmp_, soft, borrow, causal, heads = s["compare"], s["scale"], s["borrow"], s["mask"], \
        s["heads"]
    toks, w = soft.tokens, soft.scaled_weights
    best = cmp_.best_match
    ib = toks.index(best)
    ctx = borrow.context
    future = float(np.triu(np.asarray(causal.weights), 1).sum())
    direction = _direction(cmp_.query)
    values = _values_do_not_decide(cmp_, borrow)
    scaling = _scaling()
    divide = s["normalize"]
    cat = cmp_.rows[ib]
    hs = heads.heads
    qa = [
        (FIRST, "Why does the word it need attention in the cat example?",
         f'Alone, "it" is unclear. Its query scores highest with {best} ({cat.arithmetic}), '
         f"so after softmax it borrows {pct(w[ib], 0)} of its new meaning from {best}.",
         {"best_match": best, "score": cat.score, "weight": w[ib]}),
        (FIRST, "What are attention weights like in plain language?",
         f"Percentages of focus: {_recipe(toks, w)} = {pct(sum(w), 0)}.",
         {"weights": w}),
        (FIRST, "What is a context vector?",
         f'The updated "it" after borrowing: {vec(ctx)}, i.e. {pct(ctx[0], 0)} '
         f'"{borrow.value_meaning[0]}" and {pct(ctx[1], 0)} "{borrow.value_meaning[1]}".',
         {"context": ctx}),
        (FIRST, "What do query, key, and value mean?",
         f'Query = what "it" looks for {vec(cmp_.query)}; key = what {best} can be matched '
         f'by {vec(cat.key)}; value = what {best} gives {vec(borrow.shares[ib].value)}.',
         {"query": cmp_.query, "key": cat.key, "value": borrow.shares[ib].value}),
        (FIRST, "What does causal masking prevent?",
         f"Looking at future tokens: the weights on later tokens add up to {future:g}; "
         f'"{causal.tokens[0]}" can only look at itself ({pct(causal.weights[0][0], 0)}).',
         {"future_weight": future}),
        (FIRST, "What is multi-head attention?",
         "Several attention heads at once, each with its own projections: "
         + "; ".join(f'head {h.name} sends "it" {pct(h.top_weight, 0)} to {h.top_token}'
                     for h in hs) + ".",
         {"heads": {h.name: [h.top_token, h.top_weight] for h in hs}}),
        (MATH, "If two vectors point in a similar direction, should their dot product be high or "
         "low?",
         "High: " + ", ".join(f'{vec(cmp_.query)}·{vec(d["vector"])} = {d["dot"]:g} ({n})'
                              for n, d in direction.items()) + ".",
         direction),
        (MATH, "Why should attention weights add up to 1?",
         f"So they are a recipe that splits one unit of attention: {_recipe(toks, w)} sums to "
         f"{sum(w):.3f}, and the context vector stays on the values' scale.",
         {"sum": float(sum(w))}),
        (MATH, "Which pair decides the score: query-key, query-value, or key-value?",
         f"Query-key. Multiplying the values by 10 and shuffling them changes the weights by "
         f'{values["max_change_from_values"]:g}; turning the cat key around moves cat from '
         f'{pct(values["weights"][0], 0)} to {pct(values["weights_cat_key_reversed"][0], 0)}.',
         values),
        (MATH, "What does softmax do to raw attention scores?",
         f'Makes them positive weights summing to 1, stronger scores getting more: scores '
         f'{vec(divide.scores)} become {", ".join(pct(x, 0) for x in divide.softmax)}, '
         f'where dividing by the total gave {", ".join(pct(x, 0) for x in divide.divided)}.',
         {"softmax": divide.softmax, "divided": divide.divided}),
        (MATH, "What gets mixed to create the context vector?",
         "The value vectors, weighted: " + " + ".join(
             f'{sh.weight:.3f}*{vec(sh.value)}' for sh in borrow.shares)
         + f" = {vec(ctx)}.",
         {"context": ctx}),
        (MATH, "Why are scores scaled before softmax?",
         "Dot products grow with the vector size: for random vectors the scores spread "
         + ", ".join(f'{v["raw_std"]:.1f} in {d} dims' for d, v in scaling["std"].items())
         + "; divided by sqrt(D) they spread "
         + ", ".join(f'{v["scaled_std"]:.2f}' for v in scaling["std"].values())
         + f'. Unscaled, three 64-dim keys gave the top one {pct(scaling["top_weight_raw"], 0)}; '
         f'scaled, {pct(scaling["top_weight_scaled"], 0)}.',
         scaling),
    ]
    return Check(title="Check yourself: the lessons' questions, answered with these numbers",
                 questions=[Question(lesson=lesson, question=q, answer=a, numbers=n)
                            for lesson, q, a, n in qa])
