"""`attnlab track-heads`: watch induction heads form while a small GPT trains.

Trains the `induction` preset (2 attention-only layers, 4 heads, 64 wide, rotary positions, 128
characters of context, on the bundled corpus with half the training windows a stretch of text
repeated to fill the window; --repeat-prob 0 trains on the plain corpus) and every --every steps
evaluates the head statistics on a fixed repeated-random probe (N random characters from the
corpus's frequent ones, then the same N again), writing them to DIR/heads.jsonl (one JSON line per
evaluation: step, training and validation loss, the model's loss on the probe's first and second
copy, statistics, labels). The second copy's loss falls below the first's as induction heads form:
the training loss, half of it on repeated windows, shows that only blurred. `-o FIG` draws a
statistic's per-head curve over training next to those losses; `--plot-only` draws from a
finished run without training.
"""

from __future__ import annotations

from attnlab.cli.options import (
    add_preset_setting,
    add_threads,
    check_choice,
    check_output,
    command,
    preset_settings,
)


def add_parser(sub):
    p = command(sub, "track-heads", __doc__, "train a small GPT and record its heads forming")
    p.add_argument("--out", default="runs/induction", metavar="DIR",
                   help="run directory (default: runs/induction)")
    add_preset_setting(p, "--max-steps", "N", "train N steps (default: the preset's 1500)")
    p.add_argument("--every", type=int, default=25, metavar="K",
                   help="evaluate the heads every K steps (default 25)")
    p.add_argument("--probe", type=int, default=32, metavar="N",
                   help="random tokens in each half of the probe (default 32)")
    add_preset_setting(p, "--seed", "S", "seed of the weights and batch order, as in attnlab train")
    add_preset_setting(p, "--repeat-prob", "P", "share of training windows that repeat a stretch "
                       "of their text (default: the preset's 0.5; 0 for the plain corpus)")
    p.add_argument("--stat", default="induction", metavar="STAT",
                   help="the statistic to draw (default: induction)")
    p.add_argument("-o", "--output", metavar="FIG",
                   help="draw the curves (.png or .svg; default: no figure)")
    p.add_argument("--plot-only", action="store_true",
                   help="do not train: draw --out's heads.jsonl")
    add_threads(p)
    return p


def run(args) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.explain.head_statistics import STATS
    from attnlab.explain.training import induction_summary, read_heads, track_heads

    check_choice("--stat", args.stat, STATS)
    if args.output:
        check_output("-o", args.output, (".png", ".svg"))
    if args.plot_only and not args.output:
        raise AttnlabError("--plot-only: needs -o FIG")
    if not args.plot_only:
        from attnlab.models import Trainer

        trainer = Trainer.start("induction", out=args.out, **preset_settings(args))
        path = track_heads(trainer, every=args.every, probe_n=args.probe)
        lines = read_heads(path)
        s = induction_summary(lines)
        formed = ("no head reached 0.4" if s["formed_step"] is None else
                  f"first head at 0.4 at step {s['formed_step']} (loss {s['formed_loss']:.3f})")
        start = "" if s["chance"] is None else f"; {s['chance']:.2f} at step 0"
        last = lines[-1]
        print(f"wrote {path}: step {last['step']}, loss {last['loss']:.3f}, "
              f"{trainer.elapsed_s:.0f} s training; largest induction score {s['max']:.2f} "
              f"(L{s['head'][0]} H{s['head'][1]}, step {s['max_step']}{start}); {formed}; "
              f"probe loss {last['first_copy_loss']:.2f} on the first copy, "
              f"{last['second_copy_loss']:.2f} on the second")
    if args.output:
        from attnlab.viz.head_figures import draw_run

        draw_run(args.out, args.stat, args.output)
        print(f"wrote {args.output}")
    return 0

