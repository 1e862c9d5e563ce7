"""`attnlab rollout TEXT --token WORD`: where a token's information came from, through every layer.

Attention rollout multiplies each layer's head-averaged weights, with the residual connection
added as attention to itself (Ã = (Ā + I), rows renormalized); attention flow is the maximum flow
through the same layers seen as a graph (Abnar & Zuidema 2020). Both give, for the token, a share
per input token that sums to 100%. `-o FILE.png|.svg` draws both as bars.
"""

from __future__ import annotations

from attnlab.cli.options import (
    add_text_token,
    add_threads,
    check_output,
    check_words,
    command,
    print_result,
    run_text,
)


def add_parser(sub):
    p = command(sub, "rollout", __doc__, "where a token's information came from (rollout, flow)")
    add_text_token(p, "the word (or token index) to trace back")
    p.add_argument("--heads", default="mean", metavar="H[,H...]",
                   help="average these heads of every layer (0-based, negative counts from the "
                   "last; default: all)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="also draw the shares (.png or .svg; default: no figure)")
    p.add_argument("--json", action="store_true", help="print tokens, rollout and flow as JSON")
    add_threads(p)
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
    from attnlab.explain.attention_flow import token_sources
    from attnlab.viz.explain_text import render_sources

    heads = _heads(args.heads)
    check_words(args)
    if args.output:
        check_output("-o", args.output, (".png", ".svg"))
    att = run_text(args.model, args.text)
    sources = token_sources(att, args.token, heads)
    print_result(args.json, sources.to_json,
                 lambda: render_sources(sources, heads_spec=args.heads))
    if args.output:
        from attnlab.viz.head_figures import figure_sources, save_figure

        save_figure(figure_sources(sources.tokens, sources.focus,
                                   {"rollout": sources.rollout[sources.focus],
                                    "flow": sources.flow[sources.focus]}), args.output)
        if not args.json:
            print(f"wrote {args.output}")
    return 0
