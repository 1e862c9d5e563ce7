"""The report of `attnlab explain` as plain text: each token and the head that gives it the most
weight, the heads ranked, and the lesson's table for one head filled from the model."""

from __future__ import annotations

import math
import textwrap

from attnlab.explain.attention_flow import TokenSources
from attnlab.explain.token import READING, ExplainReport
from attnlab.formats import pct

MINUS_INF = "\u2212\u221e"


def render_explain(r: ExplainReport, n_layers: int, n_heads: int,
                   warnings: list[str] | None = None) -> str:
    """`attnlab explain` as plain text, from `attnlab.explain.token.explain_token`'s report;
    `warnings` (the tokenizer's losses, `attnlab.explain.vocabulary`) printed first."""
    toks, f = r.tokens, r.focus
    word = r.word if len(r.pieces) > 1 else toks[f]
    kind = "causal" if r.causal else "bidirectional"
    out = [f'{r.model} ({n_layers} layers x {n_heads} heads, {kind}): what "{word}" '
           f"(token {f}) borrows from the other tokens"]
    if len(r.pieces) > 1:
        parts = " + ".join(toks[i] for i in r.pieces)
        out.append(f'"{r.word}" is split into {parts}; token {f} speaks for the word.')
    out.append("tokens: " + " ".join(f"{i}:{t}" for i, t in enumerate(toks)))
    if r.also:
        where = ", ".join(f"token {run[0]}" if len(run) == 1 else f"tokens {run[0]}-{run[-1]}"
                          for run in r.also)
        out.append(f'"{word}" is token {f}; "{word}" is also {where} (--token {r.also[0][0]} '
                   "explains that one).")
    for w in warnings or ():
        out += textwrap.wrap(f"warning: {w}", 100, subsequent_indent="  ")
    out += ["", *textwrap.wrap(READING.format(word=f'"{word}"'), 100)]
    out += ["", *_per_token(r, word, n_layers, n_heads)]
    out += ["", "Heads that lean hardest on one token (positional heads, which look at a "
            "neighbour whatever the word, left out):"]
    for h in r.ranking:
        out.append(f"  layer {h.layer} head {h.head:<3} {pct(h.weight)} on "
                   f"{h.token}:{toks[h.token]}")
    out += ["", *_detail(r, word)]
    out.append("")
    out.append("Other heads: --layer L --head H (0-based); the head for one word: --target WORD; "
               "as data: --json.")
    return "\n".join(out) + "\n"


def _per_token(r: ExplainReport, word: str, n_layers: int, n_heads: int) -> list[str]:
    f = r.focus
    roll = r.rollout
    out = [*textwrap.wrap(f'Each token: the one head (of {n_layers * n_heads}) that gives it '
                          f'the most of "{word}"\'s attention' +
                          (f", and attention rollout (all {n_layers} layers, {n_heads} heads "
                           "averaged, the residual counted):" if roll is not None else ":"), 100),
           f"  {'pos':>3} {'token':<12} {'head':<9} {'weight':>6}" +
           (f" {'rollout':>8}" if roll is not None else "")]
    positional = {(h.layer, h.head): h.offset for h in r.positional_heads}
    for t in r.per_token:
        if t.index == f:
            continue
        note = ""
        if not t.allowed:
            note = "  (masked: after the word, a causal model cannot look)"
        elif positional.get((t.layer, t.head)) == t.index - f:
            note = f"  (positional head: looks {t.index - f:+d} token away, whatever the word)"
        elif t.index in r.special:
            note = "  (special token: heads park attention they do not need here)"
        elif t.top_pick and t.weight >= 0.5 and t.index not in r.special:
            note = f'  <- layer {t.layer} head {t.head} borrows mostly from "{t.token}"'
        rcol = f" {pct(roll[t.index], 8)}" if roll is not None else ""
        out.append(f"  {t.index:>3} {t.token:<12} L{t.layer} H{t.head:<5} "
                   f"{pct(t.weight)}{rcol}{note}")
    if roll is not None:
        out += ["", *textwrap.wrap(_why_they_differ(r, word), 100)]
    return out


def _why_they_differ(r: ExplainReport, word: str) -> str:
    """The two columns answer different questions: say which, with this text's numbers."""
    toks, f, d = r.tokens, r.focus, r.detail
    best = max(range(len(toks)), key=lambda j: -1.0 if j == f else d.weights[j])
    top_roll = max(range(len(toks)), key=lambda j: r.rollout[j])
    text = (f"Why the columns differ: a weight is one head taken alone, and the table keeps the "
            f"largest of {len(r.heads)}. Rollout averages each layer's heads (layer {d.layer}'s "
            f'heads give "{toks[best]}" {pct(r.layer_mean[best]).strip()} on average where '
            f"head {d.head} alone gives {pct(d.weights[best]).strip()}) and multiplies the "
            f'layers with the residual, so "{word}" keeps {pct(r.rollout[f]).strip()} of itself')
    if top_roll != f:
        text += f' and "{toks[top_roll]}" gets {pct(r.rollout[top_roll]).strip()}'
    return text + (". Neither is an explanation: one shows where single heads look, the other "
                   "how the mixing compounds through the layers.")


def _scale_words(d) -> str:
    if d.head_dim and abs(d.scale * math.sqrt(d.head_dim) - 1) < 1e-6:
        return f"\u00d7 1/\u221a{d.head_dim} = {d.scale:.4f}"
    return f"\u00d7 {d.scale:.4g}"


def _detail(r: ExplainReport, word: str) -> list[str]:
    d, toks = r.detail, r.tokens
    scale = _scale_words(d)
    size = (f" ({d.head_dim} = the size of this head's queries and keys, the lesson's "
            "cooling step)" if d.head_dim and scale.startswith("\u00d7 1/") else "")
    allowed = sum(d.mask)
    if allowed == len(toks):
        mask = (f'mask: +0 where "{word}" may look, \u2212\u221e where it may not; this text '
                "has no padding and the model is bidirectional, so every key gets +0")
    else:
        mask = (f'mask: +0 where "{word}" may look, \u2212\u221e where it may not '
                f"({len(toks) - allowed} keys: softmax gives them 0%)")
    lines = [f'Layer {d.layer}, head {d.head} ({d.why}): the lesson\'s table for '
             f'"{word}" (token {r.focus}), filled from the model',
             *textwrap.wrap(f'compare: q\u00b7k, the query of "{word}" with each key; scale: '
                            f"{scale}{size}; {mask}; softmax: the percentages.", 100,
                            initial_indent="  ", subsequent_indent="  "),
             f"  {'pos':>3} {'token':<12} {'q·k score':>10} {scale.split(' =')[0]:>10} "
             f"{'mask':>6}  softmax"]
    for j, tok in enumerate(toks):
        if d.mask[j]:
            lines.append(f"  {j:>3} {tok:<12} {d.scores[j]:10.2f} {d.scaled_scores[j]:10.2f} "
                         f"{'+0':>6}  {pct(d.weights[j])}")
        else:
            lines.append(f"  {j:>3} {tok:<12} {d.scores[j]:10.2f} {'':>10} "
                         f"{MINUS_INF:>6}  {pct(0.0)}")
    lines += ["", f'Largest contributions to the context vector of "{word}" (weight x value; '
              "share = part of the context vector along its own direction):"]
    for c in d.contributions:
        lines.append(f"  {c.index:>3} {c.token:<12} weight {pct(c.weight)}  |w*v| {c.norm:7.3f}  "
                     f"share {pct(c.share)}")
    return lines


def render_sources(s: TokenSources, heads_spec: str = "mean") -> str:
    """`attnlab rollout` as plain text, from `attnlab.explain.attention_flow.TokenSources`."""
    f = s.focus
    out = [f'{s.model}: where "{s.tokens[f]}" (token {f}) came from, through {s.n_layers} '
           f"layers (heads: {heads_spec})",
           f"  {'token':<14} {'rollout':>7} {'flow':>7}"]
    for j, tok in enumerate(s.tokens):
        if s.causal and j > f:
            continue
        out.append(f"  {j:>2}:{tok[:11]:<11} {pct(s.rollout[f, j], 6)} {pct(s.flow[f, j], 6)}")
    return "\n".join(out) + "\n"
