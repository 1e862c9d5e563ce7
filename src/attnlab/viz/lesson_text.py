"""The lesson as plain terminal text, from the data `attnlab.explain.lesson_sections` computes."""

from __future__ import annotations

from attnlab.explain.lesson_records import Section
from attnlab.explain.lessons import lessons_intro
from attnlab.formats import pct, vec


def _compare(s) -> list[str]:
    keys = [f'  key for {r.token!r:<10} = {vec(r.key):<8}  score = {r.arithmetic}' for r in s.rows]
    return [f'query for "{s.query_token}" = {vec(s.query)}', *keys,
            f'Highest score: {s.best_match} (the best match, nothing borrowed yet).']


def _normalize(s) -> list[str]:
    return [f'scores {vec(s.scores)}, total {s.total:g}',
            "  divided by the total: " + ", ".join(pct(x) for x in s.divided),
            "  softmax instead:      " + ", ".join(pct(x) for x in s.softmax),
            f'Problem: {s.problem}; softmax keeps every weight positive, summing to 100%.']


def _scale(s) -> list[str]:
    lines = ["token      score  weight   | scaled score  weight"]
    for tok, a, w, b, w2 in zip(s.tokens, s.scores, s.weights, s.scaled_scores,
                                s.scaled_weights):
        lines.append(f"{tok:<9} {a:6.2f}  {pct(w)}   | {b:12.3f}  {pct(w2)}")
    lines.append(f'Weights sum to {s.sum:.3f}. Scaling by 1/sqrt({s.head_dim}) = '
                 f'{s.scale:.3f} cools the scores, so softmax is less sure of itself.')
    return lines


def _borrow(s) -> list[str]:
    shares = [f'  {pct(sh.weight)} of {sh.token:<8} value {vec(sh.value):<11} -> '
              f'{vec(sh.contribution)}' for sh in s.shares]
    return [f'value dims mean: {", ".join(s.value_meaning)}', *shares,
            f'context vector for "it" = {vec(s.context)}  (mostly cat information)']


def _mask(s) -> list[str]:
    toks = s.tokens
    lines = ["current token | allowed to look at"]
    for tok, seen in zip(toks, s.sees):
        lines.append(f"{tok:<13} | {', '.join(seen)}")
    lines.append("weights after masking (rows: query, columns: key):")
    lines.append("       " + " ".join(f"{t:>6}" for t in toks))
    for tok, row in zip(toks, s.weights):
        lines.append(f"{tok:<6} " + " ".join(f"{pct(w):>6}" for w in row))
    return lines


def _heads(s) -> list[str]:
    toks, feats = s.tokens, s.features
    lines = [f'Every token has four features ({", ".join(feats)}); each head projects them with '
             "its own W_q and W_k."]
    for h in s.heads:
        used_q = [f for f, row in zip(feats, h.w_q) if any(row)]
        used_k = [f for f, row in zip(feats, h.w_k) if any(row)]
        lines.append(f'head {h.name:<7} looks for {h.looks_for}: query from '
                     f'{" + ".join(used_q)}, keys from {" + ".join(used_k)}')
        lines.append(f'  query for "{s.query_token}" = {vec(h.query)}; scores '
                     + ", ".join(f"{t} {x:g}" for t, x in zip(toks, h.scores)))
        lines.append("  weights " + ", ".join(f"{t} {pct(w).strip()}"
                                                for t, w in zip(toks, h.weights)))
        lines.append(f'  -> "{s.query_token}" borrows most from {h.top_token} '
                     f'({pct(h.top_weight).strip()})')
    lines.append("Same sentence, same tokens: only the projections differ, so each head finds a "
                 "different pattern.")
    return lines


def _check(s) -> list[str]:
    lines, lesson = [], None
    for q in s.questions:
        if q.lesson != lesson:
            lesson = q.lesson
            lines.append(f"[{lesson}]")
        lines.append(f'  Q: {q.question}')
        lines.append(f'  A: {q.answer}')
    return lines


RENDERERS = {"compare": _compare, "normalize": _normalize, "scale": _scale, "borrow": _borrow,
             "mask": _mask, "heads": _heads, "check": _check}


def intro() -> str:
    """What `attnlab lesson` says first: the two lessons it follows, by title."""
    import textwrap

    lines = ["attnlab's lesson follows two texts (read them first, or alongside):"]
    for line in lessons_intro():
        lines += textwrap.wrap(line, 100, initial_indent="  ", subsequent_indent="     ")
    lines.append("Below, every number those lessons use is computed, not copied; then the same "
                 "arithmetic past one head.")
    return "\n".join(lines) + "\n\n"


def render_lesson(sections: list[Section]) -> str:
    out = []
    for i, s in enumerate(sections, 1):
        out.append(f"{i}. {s.title}")
        out.extend(RENDERERS[s.name](s))
        out.append("")
    return "\n".join(out).rstrip() + "\n"
