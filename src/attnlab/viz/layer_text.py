"""The lesson past one head as terminal text, from `attnlab.explain.layer.LayerWalk`: where q, k
and v come from, the heads through W_o, the residual and the layer norms, and positions."""

from __future__ import annotations

import textwrap

from attnlab.explain.layer import LayerWalk
from attnlab.formats import pct


def _v(x, n: int = 4) -> str:
    """The first n numbers of a vector and its length: [0.123, -0.456, …] (384)."""
    head = ", ".join(f"{float(a):.3f}" for a in x[:n])
    return f"[{head}{', …' if len(x) > n else ''}] ({len(x)})"


def _wrap(text: str, indent: str = "  ") -> list[str]:
    return textwrap.wrap(text, 100, initial_indent=indent, subsequent_indent=indent + "  ")


def render_layer(w: LayerWalk) -> str:
    """The three steps past one head, every number from `w`, each with its check."""
    tok, D, H, d = w.tokens[w.token], w.head_dim, w.n_heads, w.d_model
    c = w.checks
    lo, hi = w.head * D, (w.head + 1) * D - 1
    pre = w.norm == "pre"
    xin = "LN₁(x)" if pre else "x"
    out = [f'Past one head: "{tok}" (token {w.token}) through layer {w.layer} of {w.model}, '
           f"head {w.head} in detail (float64, from the model's own weights)", ""]
    out += _wrap(f'(1) Where q, k and v come from. x is "{tok}"\'s vector entering layer '
                 f"{w.layer} ({d} numbers: the model's running representation of the token)" +
                 ("; this model normalizes it first, LN₁(x)." if pre else "."), "")
    out.append(f"  x               = {_v(w.x)}")
    if pre:
        out.append(f"  LN₁(x)          = {_v(w.x_in)}")
    out.append(f"  q = {xin}·W_q + b_q = {_v(w.q)}   W_q: this head's columns {lo}..{hi} of "
               f"the layer's {d} × {d}")
    terms = " + ".join(f"{w.x_in[m]:.3f}·W_q[{m},0]" for m in range(2))
    out += _wrap(f"q[0] = {terms} + … ({d} products) + b_q[0] = {w.q[0]:.3f}", "    ")
    out.append(f"  k = {xin}·W_k + b_k = {_v(w.k)}")
    out.append(f"  v = {xin}·W_v + b_v = {_v(w.v)}")
    out += _wrap(f"checked against the model's own projections: q {c['q']:.1e}, k {c['k']:.1e}, "
                 f"v {c['v']:.1e} (largest difference). Every token gets its q, k, v from the "
                 "same W_q, W_k, W_v: the three roles are three learned views of one vector.")
    best = max(range(len(w.weights)), key=lambda j: w.weights[j])
    out += ["", *_wrap(f"(2) Many heads, one layer. Each of the {H} heads weighs the values with "
                       f"its own percentages (head {w.head}: {pct(w.weights[best]).strip()} on "
                       f'"{w.tokens[best]}") and gives a context vector of {D} numbers:', "")]
    for h in sorted({0, w.head, H - 1}):
        out.append(f"  head {h:<2} context  = {_v(w.contexts[h], 3)}")
    out += [f"  concatenated    = {_v(w.concat)}   {H} heads × {D} = {H * D}",
            f"  · W_o + b_o     = {_v(w.attn_out)}   the attention output: what the heads add",
            f"  x + that        = {_v(w.residual)}   the residual: added to x, not put in its "
            "place"]
    if w.attn_norm is not None:
        out.append(f"  layer norm      = {_v(w.attn_norm)}   the attention block's output "
                   f"(checked {c['attention_output']:.1e})")
        out += _wrap(f"then the feed-forward ({d} → {4 * d} → {d}, GELU) is added the same way "
                     f"and normalized: the layer's output, the next layer's x = {_v(w.output)} "
                     f"(checked against the model's hidden state {c['layer_output']:.1e}).")
    else:
        out += _wrap(f"(checked {c['attention_output']:.1e}); then the feed-forward on LN₂ of it "
                     f"is added the same way: the layer's output, the next layer's x = "
                     f"{_v(w.output)} (checked against the model's own {c['layer_output']:.1e}).")
    out += ["", *_positions(w)]
    return "\n".join(out) + "\n"


def _positions(w: LayerWalk) -> list[str]:
    p, tok = w.positions, w.tokens[w.token]
    out = _wrap("(3) Positions. Attention by itself ignores order: shuffle the keys and each one "
                "keeps its weight. The model has to put the position into the vectors.", "")
    if p.kind == "learned" and p.position is not None:
        typ = f" + type 0 {_v(p.type, 3)}" if p.type is not None else ""
        norm = " → layer norm" if p.type is not None else ""
        out += _wrap(f'word "{tok}" {_v(p.word, 3)} + position {w.token} {_v(p.position, 3)}'
                     f"{typ}{norm} → x₀ = {_v(p.x0, 3)}" +
                     (f" (checked {p.x0_error:.1e})" if p.x0_error is not None else ""))
    if p.prev_head is not None:
        h = p.prev_head
        out += _wrap(f"Why a previous-token head can exist: with the words taken out (positions "
                     f"alone), layer {h['layer']} head {h['head']} still gives its highest score "
                     f"to the previous position for {h['hits']} of {h['rows']} tokens. Its W_q "
                     "and W_k match position i with position i − 1, whatever the word.")
    if p.rotary_dots is not None:
        i, j = w.token, max(w.token - 1, 0)
        a, b = p.rotary_dots
        who = ("attnlab's GPT (rotary) rotates" if p.kind == "rotary" else
               "Rotary positions (attnlab's GPT with rotary=True) instead rotate")
        out += _wrap(f"{who} each pair of q's and k's numbers by position × θ_m (θ_m = "
                     f"10000^(−2m/D)): position {i} turns pair 0 by {p.angles[0]:.3f} rad. The "
                     f"same turn for both leaves a dot product as it was, so q·k depends only on "
                     f"the distance: this head's q at {i} · k at {j} = {a:.6f}, both moved "
                     f"{p.shift} on = {b:.6f}. A head can then prefer distance 1 for every word.")
    return out
