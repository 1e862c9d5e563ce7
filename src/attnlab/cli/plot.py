"""`attnlab plot TEXT -o FILE.png|FILE.svg`: a model's attention as a figure.

No --layer: every layer and head as thumbnails; --layer L: that layer's heads as a grid;
--layer L --head H: one head with every token labelled. Masked cells are grey and hatched.
--stat NAME: a layers × heads heatmap of a head statistic over TEXT (see `attnlab heads`);
--model DIR --stat NAME without TEXT: that statistic per head over a run trained with
--track-heads (DIR holds heads.jsonl), next to its losses (training, validation, and the probe's
first and second copy where the run recorded them).
"""

from __future__ import annotations

from pathlib import Path

from attnlab.cli.options import (
    MODEL_HELP,
    add_alias,
    add_model,
    add_threads,
    check_output,
    check_text,
    command,
    run_text,
)


def add_parser(sub):
    p = command(sub, "plot", __doc__, "draw a model's attention on a text as PNG or SVG")
    p.add_argument("text", nargs="?",
                   help="the text to run the model on (none: with --stat, --model is a run "
                   "directory holding heads.jsonl)")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="where to write the figure (.png or .svg)")
    p.add_argument("--layer", type=int,
                   help="one layer (0-based, negative counts from the last; default: every layer)")
    p.add_argument("--head", type=int,
                   help="one head of --layer (0-based, negative counts from the last; default: "
                   "every head)")
    model = add_model(p, help=MODEL_HELP + "; without TEXT, with --stat: a run directory "
                      "holding heads.jsonl (train --track-heads, track-heads)")
    p.add_argument("--stat", metavar="NAME",
                   help="draw this head statistic per head instead (default: the weights)")
    add_alias(p, "--run", model)
    add_threads(p)
    return p


def run(args) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.viz.figures import FORMATS, save_plot

    # fail before the model loads (seconds) on what we can check without it
    out = check_output("-o", args.output, FORMATS)
    if args.head is not None and args.layer is None:
        raise AttnlabError(f"--head {args.head}: needs --layer too")
    a_run = args.text is None and args.model is not None \
        and (Path(args.model) / "heads.jsonl").is_file()
    if args.stat is not None or a_run:
        from attnlab.cli.heads import plot_stat

        run = args.model if args.text is None else None  # a run directory: its curves
        model = None if args.text is None else args.model
        print(plot_stat(args.text, out, stat=args.stat, run=run, model=model))
        return 0
    if args.text is None:
        raise AttnlabError("TEXT: give the text to run the model on")
    check_text("TEXT", args.text)
    ma = run_text(args.model, args.text)
    save_plot(ma, out, args.layer, args.head)
    what = ("all layers and heads" if args.layer is None else
            f"layer {args.layer}, all heads" if args.head is None else
            f"layer {args.layer}, head {args.head}")
    print(f"wrote {out} ({ma.model_name}, {len(ma.tokens)} tokens, {what})")
    return 0
