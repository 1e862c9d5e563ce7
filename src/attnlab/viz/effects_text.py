"""`HeadEffects` in the terminal: the layer × head grid of effects, the heads that matter most
with where each looks, and the logit lens at the measured token (causal models)."""

from __future__ import annotations

import textwrap

import numpy as np

from attnlab.explain.effects import HeadEffects, focus, looks_at

CAVEAT = ("An effect near 0 does not make a head unused: another head may do the same work "
          "(redundancy). A zero context vector is one the model never saw, so zero ablation can "
          "overstate what mean ablation (--mean-of) shows.")

_HOW = {"zero": "zero-ablated (its context vector set to 0)",
        "mean": "mean-ablated (its context vector set to its mean over the reference texts)",
        "patch": "patched (its context vector taken from the CLEAN run)"}


def render_effects(fx: HeadEffects, *, top: int = 8) -> str:
    L, H = fx.effect.shape
    lines = [f"# {fx.model_name}: each of {L * H} heads {_HOW[fx.how]}, one at a time, in one "
             "batched pass", ""]
    if fx.kind == "patch":
        lines += [f"CLEAN:   {fx.texts[0]}", f"CORRUPT: {fx.texts[1]}",
                  f"measure: {fx.what}: clean {fx.clean:.4f}, corrupt {fx.baseline:.4f}",
                  "effect: share of the clean - corrupt gap a head's patch closes "
                  "(1 = all of it)"]
    else:
        lines += [f"text:    {fx.texts[0]}", f"measure: {fx.what}: unablated {fx.baseline:.4f}",
                  "effect: the measure with the head ablated minus without"]
    lines += ["", _grid(fx.effect), ""]
    peak, key = looks_at(fx)
    f = fx.tokens[focus(fx)]
    lines.append(f"largest effects (and where {f!r} looks in that head):")
    for layer, head, e in fx.top(top):
        lines.append(f"  layer {layer} head {head:<3} {e:+.4f}   {f!r} -> "
                     f"{fx.tokens[key[layer, head]]!r} ({peak[layer, head]:.0%})")
    if fx.lens is not None:
        lines += ["", _lens(fx)]
    lines += ["", *textwrap.wrap(CAVEAT, 79)]
    return "\n".join(lines) + "\n"


def _grid(effect: np.ndarray) -> str:
    L, H = effect.shape
    rows = ["layer " + "".join(f"{'h' + str(h):>8}" for h in range(H))]
    for layer in range(L):
        rows.append(f"{layer:>5} " + "".join(f"{v:>+8.3f}" for v in effect[layer]))
    return "\n".join(rows)


def _lens(fx: HeadEffects) -> str:
    lens = fx.lens
    pos = fx.position - 1 if fx.position else len(fx.tokens) - 1
    after = fx.tokens[pos]
    out = [f"logit lens: the top next token after {after!r} (position {pos}), read after each "
           "layer through the final norm and unembedding:"]
    for i, (tops, ps) in enumerate(zip(lens["top"], lens["p"])):
        name = "embeddings" if i == 0 else f"layer {i - 1}"
        p_next = lens["p_next"][i][pos]
        nxt = "" if p_next is None else f"   p(next = {fx.tokens[pos + 1]!r}) = {p_next:.3f}"
        out.append(f"  {name:<11} {tops[pos]!r:<8} {ps[pos]:.3f}{nxt}")
    return "\n".join(out)
