"""`attnlab ablate TEXT --token WORD`: what each head matters for. Every head of the model is
ablated on TEXT, one at a time, all in one batched pass, and the change of a measure is shown as a
layer x head grid next to where the token looks in the heads that matter most.

Measures (--measure): an encoder (the default all-MiniLM-L6-v2) `cosine` of the token's final
representation to the unablated one, or `similarity` of the text's and --other's mean-pooled
embeddings; a causal LM (a checkpoint attnlab trained, a local Hugging Face causal LM) `logprob`
of the token given the tokens before it, `logit-diff` of two --answers after the text, or `loss`
over the text. Zero ablation sets a head's context vector to 0; --mean-of TEXT... sets it to
its mean over those texts instead. Causal models also get the logit lens at the token.

`--repeat-random N` (a checkpoint attnlab trained, no TEXT): the induction story. N random
characters then the same N again; the induction head (`attnlab heads --repeat-random`) ablated
(zero and mean), the previous-token head ablated and the induction head patched back, with the
loss on each copy; and every head's effect on both.
"""

from __future__ import annotations

from attnlab.cli.options import (
    add_model,
    add_threads,
    check_output,
    check_text,
    command,
    open_model,
    print_result,
)

MEASURE_HELP = ("cosine or similarity (an encoder; default cosine), logprob, logit-diff or loss "
                "(a causal LM; default logprob)")


def add_parser(sub):
    p = command(sub, "ablate", __doc__, "ablate every head in turn: what each one matters for")
    p.add_argument("text", metavar="TEXT", nargs="?", default=None,
                   help="the text to run the model on")
    p.add_argument("--token", metavar="WORD", default=None,
                   help="the word (or token index) the measure reads (default: the last token)")
    p.add_argument("--measure", metavar="NAME", default=None, help=MEASURE_HELP)
    p.add_argument("--answers", nargs=2, metavar=("A", "B"), default=None,
                   help="the two one-token answers of --measure logit-diff (default: none)")
    p.add_argument("--other", metavar="TEXT", default=None,
                   help="the second sentence of --measure similarity (default: none)")
    p.add_argument("--mean-of", nargs="+", metavar="TEXT", default=None,
                   help="mean ablation: replace a head by its mean over these texts (default: "
                   "zero ablation)")
    p.add_argument("--repeat-random", type=int, metavar="N", default=None,
                   help="the induction story on N random characters repeated, instead of TEXT "
                   "(default: none)")
    p.add_argument("--probe-seed", type=int, default=0, metavar="S",
                   help="seed of --repeat-random's characters")
    add_common(p)
    return p


def add_common(p) -> None:
    """The options ablate and patch share."""
    p.add_argument("--top", type=int, default=8, metavar="K",
                   help="list the K heads of largest effect")
    p.add_argument("-o", "--output", metavar="FILE.html",
                   help="also write the effects page (default: no page)")
    p.add_argument("--json", action="store_true", help="print the effects as JSON")
    add_model(p)
    add_threads(p)


def check_common(args) -> None:
    from attnlab.errors import AttnlabError

    if args.top < 1:
        raise AttnlabError(f"--top {args.top}: expected a positive number")
    if args.output:
        check_output("-o", args.output, (".html", ".htm"))


def show(fx, args) -> int:
    """Print the effects (text or --json) and write the page when -o is given."""
    from attnlab.viz.effects_text import render_effects

    print_result(args.json, fx.to_json, lambda: render_effects(fx, top=args.top))
    if args.output:
        from attnlab.viz.effects_page import write_effects_page

        out = write_effects_page(fx, args.output)
        if not args.json:
            print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB); open it in a browser, no "
                  "network needed")
    return 0


def _story(args) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.explain.induction import induction_story
    from attnlab.viz.induction_text import render_story

    if args.text is not None:
        raise AttnlabError("TEXT: --repeat-random makes its own text; leave TEXT out")
    if args.output:
        raise AttnlabError("-o: the induction story has no page; use --json")
    story = induction_story(open_model(args.model), args.repeat_random, seed=args.probe_seed)
    print_result(args.json, story.to_json, lambda: render_story(story))
    return 0


def run(args) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.explain.effects import ablation_effects

    if args.repeat_random is not None:
        return _story(args)
    if args.text is None:
        raise AttnlabError("TEXT: give the text to run the model on (or --repeat-random N)")
    check_text("TEXT", args.text)
    for t in (args.other, *(args.mean_of or [])):
        if t is not None:
            check_text("TEXT", t)
    check_common(args)
    fx = ablation_effects(args.text, open_model(args.model), token=args.token,
                          measure=args.measure, answers=args.answers, other=args.other,
                          mean_of=args.mean_of)
    return show(fx, args)
