"""`attnlab rollout TEXT --token WORD`: where a token's information came from, through every layer.

Attention rollout multiplies each layer's head-averaged weights, with the residual connection
added as attention to itself (Ã = (Ā + I), rows renormalised); attention flow is the maximum flow
through the same layers seen as a graph (Abnar & Zuidema 2020). Both give, for the token, a share
per input token that sums to 100%. `-o FILE.png|.svg` draws both as bars.
"""

from __future__ import annotations

import argparse


def add_parser(sub):
    p = sub.add_parser("rollout", help="where a token's information came from (rollout, flow)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", help="the text to run the model on")
    p.add_argument("--token", required=True, metavar="WORD",
                   help="the word (or token index) to trace back")
    p.add_argument("--model", metavar="PATH", default=None,
                   help="a local model directory or an attnlab checkpoint (default: the "
                   "packaged all-MiniLM-L6-v2)")
    p.add_argument("--heads", default="mean", metavar="H[,H...]",
                   help="average these heads of every layer (default: all)")
    p.add_argument("-o", "--output", metavar="FILE", help="also draw the shares (.png or .svg)")
    p.add_argument("--json", action="store_true", help="print tokens, rollout and flow as JSON")
    return p


def _heads(spec: str):
    from attnlab.errors import AttnlabError

    if spec == "mean":
        return "mean"
    try:
        return [int(x) for x in spec.split(",")]
    except ValueError:
        raise AttnlabError(f"--heads {spec!r}: expected 'mean' or head indices such as 0,3")\
            from None


def run(args) -> int:
    import json
    import sys
    from pathlib import Path

    from attnlab.adapters.quiet import quiet_transformers
    from attnlab.errors import AttnlabError
    from attnlab.explain.attention_flow import flow, rollout
    from attnlab.explain.model import run_model
    from attnlab.explain.token import find_word, focus_of
    from attnlab.formats import pct

    heads = _heads(args.heads)
    if args.output:
        out = Path(args.output)
        if out.suffix.lower() not in (".png", ".svg"):
            raise AttnlabError(f"-o: expected a file ending in .png or .svg, got {args.output!r}")
        if not out.parent.is_dir():
            raise AttnlabError(f"-o: no such directory {str(out.parent)!r}")
    quiet_transformers()
    att = run_model(args.text, args.model)
    focus = focus_of(att, find_word(att.tokens, args.token))
    r, f = rollout(att, heads), flow(att, heads)
    if args.json:
        json.dump({"model": att.model_name, "tokens": att.tokens, "focus": focus,
                   "heads": heads, "rollout": r.round(6).tolist(), "flow": f.round(6).tolist()},
                  sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(f'{att.model_name}: where "{att.tokens[focus]}" (token {focus}) came from, through '
              f"{att.n_layers} layers (heads: {args.heads})")
        print(f"  {'token':<14} {'rollout':>7} {'flow':>7}")
        for j, tok in enumerate(att.tokens):
            if att.causal and j > focus:
                continue
            print(f"  {j:>2}:{tok[:11]:<11} {pct(r[focus, j], 6)} {pct(f[focus, j], 6)}")
    if args.output:
        from attnlab.viz.head_figures import figure_sources, save_figure

        save_figure(figure_sources(att.tokens, focus, {"rollout": r[focus], "flow": f[focus]}),
                    args.output)
        if not args.json:
            print(f"wrote {args.output}")
    return 0
