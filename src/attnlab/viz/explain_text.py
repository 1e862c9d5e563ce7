"""The report of `attnlab explain` as plain text: each token and the head that gives it the most
weight, the heads ranked, and the lesson's table for one head filled from the model."""

from __future__ import annotations

from attnlab.explain.attention_flow import TokenSources
from attnlab.explain.token import ExplainReport
from attnlab.formats import pct


def render_explain(r: ExplainReport, n_layers: int, n_heads: int) -> str:
    """`attnlab explain` as plain text, from `attnlab.explain.token.explain_token`'s report."""
    toks, f = r.tokens, r.focus
    word = r.word if len(r.pieces) > 1 else toks[f]
    kind = "causal" if r.causal else "bidirectional"
    out = [f'{r.model} ({n_layers} layers x {n_heads} heads, {kind}): what "{word}" '
           f"(token {f}) borrows from the other tokens"]
    if len(r.pieces) > 1:
        parts = " + ".join(toks[i] for i in r.pieces)
        out.append(f'"{r.word}" is split into {parts}; token {f} speaks for the word.')
    out.append("tokens: " + " ".join(f"{i}:{t}" for i, t in enumerate(toks)))
    out += ["", f'Each token, and the head that gives it the most of "{word}"\'s attention:',
            f"  {'token':<12} {'head':<9} weight"]
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
        out.append(f"  {t.token:<12} L{t.layer} H{t.head:<5} {pct(t.weight)}{note}")
    out += ["", "Heads that lean hardest on one token (positional heads, which look at a "
            "neighbour whatever the word, left out):"]
    for h in r.ranking:
        out.append(f"  layer {h.layer} head {h.head:<3} {pct(h.weight)} on {toks[h.token]}")
    out += ["", *_detail(r, word)]
    out.append("")
    out.append("Other heads: --layer L --head H (0-based); the head for one word: --target WORD; "
               "as data: --json.")
    return "\n".join(out) + "\n"


def _detail(r: ExplainReport, word: str) -> list[str]:
    d, toks = r.detail, r.tokens
    lines = [f'Layer {d.layer}, head {d.head} ({d.why}): the lesson\'s table for '
             f'"{word}", filled from the model',
             f"  {'token':<12} {'q·k score':>10} {'x ' + format(d.scale, '.4g'):>10}  "
             f"{'mask':<6} softmax"]
    for j, tok in enumerate(toks):
        if d.mask[j]:
            lines.append(f"  {tok:<12} {d.scores[j]:10.2f} {d.scaled_scores[j]:10.2f}  "
                         f'{"yes":<6} {pct(d.weights[j])}')
        else:
            lines.append(f"  {tok:<12} {'':>10} {'':>10}  {'no':<6} {pct(0.0)}")
    lines += ["", f'Largest contributions to the context vector of "{word}" (weight x value; '
              "share = part of the context vector along its own direction):"]
    for c in d.contributions:
        lines.append(f"  {c.token:<12} weight {pct(c.weight)}  |w*v| {c.norm:7.3f}  "
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
