"""`attnlab track-heads`: watch induction heads form while a small GPT trains.

Trains the `induction` setting (2 attention layers, 4 heads, 64 wide, 128 characters of context, on
the bundled corpus) and every --every steps evaluates the head statistics on a fixed
repeated-random probe (N random characters, then the same N again), writing them to
DIR/heads.jsonl (one JSON line per evaluation: step, loss, statistics, labels). `-o FIG` draws a
statistic's per-head curve over training next to the loss; `--plot-only` draws from a finished
run without training.
"""

from __future__ import annotations

import argparse


def add_parser(sub):
    p = sub.add_parser("track-heads", help="train a small GPT and record its heads forming",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/induction", metavar="DIR",
                   help="run directory (default: runs/induction)")
    p.add_argument("--max-steps", type=int, default=None, metavar="N",
                   help="train N steps (default: 1200)")
    p.add_argument("--every", type=int, default=25, metavar="K",
                   help="evaluate the heads every K steps (default 25)")
    p.add_argument("--probe", type=int, default=32, metavar="N",
                   help="random tokens in each half of the probe (default 32)")
    p.add_argument("--seed", type=int, default=None, help="training seed")
    p.add_argument("--stat", default="induction", metavar="STAT",
                   help="the statistic to draw (default: induction)")
    p.add_argument("-o", "--output", metavar="FIG", help="draw the curves (.png or .svg)")
    p.add_argument("--plot-only", action="store_true",
                   help="do not train: draw --out's heads.jsonl")
    return p


def run(args) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.explain.head_names import STATS
    from attnlab.explain.training import INDUCTION, read_heads, track_heads

    if args.stat not in STATS:
        raise AttnlabError(f"--stat {args.stat!r}: expected one of {', '.join(STATS)}")
    if args.output and not args.output.lower().endswith((".png", ".svg")):
        raise AttnlabError(f"-o: expected a file ending in .png or .svg, got {args.output!r}")
    if args.plot_only and not args.output:
        raise AttnlabError("--plot-only: needs -o FIG")
    if not args.plot_only:
        from attnlab.models import Trainer

        train = dict(INDUCTION["train"])
        if args.max_steps is not None:
            train["max_steps"] = args.max_steps
        if args.seed is not None:
            train["seed"] = args.seed
        trainer = Trainer.start("tiny", out=args.out, model_overrides=INDUCTION["model"], **train)
        path = track_heads(trainer, every=args.every, probe_n=args.probe)
        last = read_heads(path)[-1]
        best = max(v for row in last["stats"]["induction"] for v in row if v is not None)
        print(f"wrote {path}: step {last['step']}, loss {last['loss']:.3f}, largest induction "
              f"score {best:.2f}")
    if args.output:
        from attnlab.viz.head_figures import draw_run

        draw_run(args.out, args.stat, args.output)
        print(f"wrote {args.output}")
    return 0

