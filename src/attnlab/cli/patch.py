"""`attnlab patch CLEAN CORRUPT`: activation patching, head by head. The model runs on CORRUPT
with one head's context vector taken from its run on CLEAN, for every head in one batched pass;
each head's effect is the share of the CLEAN - CORRUPT gap of a measure that its patch closes.

Measure: a causal LM: the logit of --answers A minus B after the text, or (without --answers)
the log-probability of the clean run's top next token; an encoder: the cosine of --token's final
representation to the clean run's. CLEAN and CORRUPT must have as many tokens.
"""

from __future__ import annotations

from attnlab.cli.ablate import add_common, check_common, show
from attnlab.cli.options import check_text, command, open_model


def add_parser(sub):
    p = command(sub, "patch", __doc__, "patch each head from a clean run into a corrupted one")
    p.add_argument("clean", metavar="CLEAN", help="the text whose run the heads are taken from")
    p.add_argument("corrupt", metavar="CORRUPT", help="the text run with one head patched")
    p.add_argument("--token", metavar="WORD", default=None,
                   help="an encoder's token the measure reads (default: the last token)")
    p.add_argument("--answers", nargs=2, metavar=("A", "B"), default=None,
                   help="a causal LM's two one-token answers: the logit difference A - B "
                   "(default: the clean run's top next token's log-probability)")
    add_common(p)
    return p


def run(args) -> int:
    from attnlab.explain.effects import patch_effects

    check_text("CLEAN", args.clean)
    check_text("CORRUPT", args.corrupt)
    check_common(args)
    fx = patch_effects(args.clean, args.corrupt, open_model(args.model), token=args.token,
                       answers=args.answers)
    return show(fx, args)
