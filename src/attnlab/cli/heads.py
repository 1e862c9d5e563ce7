"""`attnlab heads TEXT...`: what each head of a model does, as statistics over one or more texts.

For every layer and head: entropy (and normalized), mass on itself / the previous / the next
token, on the first token (sink, [CLS]), on special tokens and on punctuation, the mean largest
weight, the most common arg-max offset and its share, and the duplicate-token and induction scores;
then a label per head. `--repeat-random N` runs the induction probe (N random tokens, then the
same N again, seeded): its `induction` is the induction score (and `duplicate` comes from it too).
Definitions: `attnlab.explain.head_statistics`.
"""

from __future__ import annotations

import json
import sys

from attnlab.cli.options import (
    add_alias,
    add_model,
    add_threads,
    check_choice,
    check_output,
    check_text,
    command,
    open_model,
    read_lines,
    run_text,
)


def add_parser(sub):
    p = command(sub, "heads", __doc__, "statistics and a label for every head of a model")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to run the model on")
    p.add_argument("--file", metavar="FILE",
                   help="more texts, one per non-empty line (default: none)")
    add_model(p)
    p.add_argument("--repeat-random", type=int, metavar="N", default=None,
                   help="add the induction probe: N random tokens then the same N again "
                   "(default: no probe)")
    seed = p.add_argument("--probe-seed", type=int, default=0, metavar="S",
                          help="seed of the probe's random tokens (default 0)")
    add_alias(p, "--seed", seed)
    p.add_argument("--sort", default=None, metavar="STAT",
                   help="sort heads by this statistic, largest first (default: max; induction "
                   "with --repeat-random)")
    p.add_argument("--top", type=int, default=None, metavar="K",
                   help="show the first K heads (default: 8 in the short report, all with --all)")
    p.add_argument("--all", action="store_true",
                   help="the full table: every head, 13 statistics each (default: a short "
                   "report, the top heads and their labels in words)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="also draw a layers x heads heatmap of the --sort statistic (.png/.svg; "
                   "default: no figure)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the statistics as JSON")
    fmt.add_argument("--csv", action="store_true", help="print one CSV line per head")
    add_threads(p)
    return p


def _texts(args) -> list[str]:
    from attnlab.errors import AttnlabError

    texts = [check_text("TEXT", t) for t in args.texts]
    if args.file:
        texts += read_lines("--file", args.file)
    for t in texts:
        if not t.strip():
            raise AttnlabError(f"TEXT: expected a non-empty text, got {t!r}")
    return texts


def run(args) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.explain.head_statistics import STATS, head_stats, with_induction
    from attnlab.explain.probe import repeat_random
    from attnlab.viz.heads_report import heads_csv, render_heads

    check_choice("--sort", args.sort, STATS)
    if args.top is not None and args.top < 1:
        raise AttnlabError(f"--top {args.top}: expected a positive number")
    if args.repeat_random is not None and args.repeat_random < 1:
        raise AttnlabError(f"--repeat-random {args.repeat_random}: expected a positive number")
    if args.probe_seed < 0:
        raise AttnlabError(f"--probe-seed {args.probe_seed}: expected a non-negative seed "
                           "(0, 1, 2, ...)")
    texts = _texts(args)
    if args.output:
        check_output("-o", args.output, (".png", ".svg"))
    if not texts and args.repeat_random is None:
        raise AttnlabError("TEXT: give at least one text (or --file FILE, or --repeat-random N)")
    loaded = open_model(args.model)
    special = loaded.special_tokens
    stats = probe = None
    if texts:
        stats = head_stats([run_text(loaded, t) for t in texts], special=special)
    if args.repeat_random is not None:
        probe = head_stats(repeat_random(loaded, args.repeat_random, seed=args.probe_seed),
                           special=special)
        stats = probe if stats is None else with_induction(stats, probe)
    sort = args.sort or ("induction" if probe is not None else "max")
    if args.json:
        out = stats.to_json()
        out["model"] = loaded.name
        if probe is not None:
            out["repeat_random"] = {"n": args.repeat_random, "seed": args.probe_seed}
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif args.csv:
        sys.stdout.write(heads_csv(stats, sort=sort, top=args.top))
    else:
        note = None
        if probe is not None:
            what = "dup and ind from" if texts else "every statistic on"
            note = (f"{what} the induction probe: {args.repeat_random} random tokens then the "
                    f"same again (seed {args.probe_seed})")
        sys.stdout.write(render_heads(stats, sort=sort, top=args.top, probe=note,
                                      full=args.all))
    if args.output:
        from attnlab.viz.head_figures import figure_stat, save_figure

        save_figure(figure_stat(stats, sort), args.output)
        if not (args.json or args.csv):
            print(f"wrote {args.output} ({sort} per head)")
    return 0


def plot_stat(text, out, *, stat, run=None, model=None) -> str:
    """`attnlab plot TEXT --stat` (a heatmap over `text`) or `plot --model DIR --stat` without
    TEXT (`run`: curves over training); returns the line to print."""
    from attnlab.errors import AttnlabError
    from attnlab.explain.head_statistics import STATS

    if stat is None:
        raise AttnlabError(f"--stat: give the statistic to draw, one of {', '.join(STATS)}")
    check_choice("--stat", stat, STATS)
    if run is not None:
        if text is not None:
            raise AttnlabError("--model: a run directory draws its training curves; leave out "
                               "TEXT")
        from attnlab.viz.head_figures import draw_run

        draw_run(run, stat, out)
        return f"wrote {out} ({stat} per head over the run in {run})"
    if text is None:
        raise AttnlabError("TEXT: give the text to run the model on (or, without TEXT, "
                           "--model DIR: a run directory holding heads.jsonl)")
    from attnlab.explain.head_statistics import head_stats
    from attnlab.viz.head_figures import figure_stat, save_figure

    check_text("TEXT", text)
    loaded = open_model(model)
    stats = head_stats(run_text(loaded, text), special=loaded.special_tokens)
    save_figure(figure_stat(stats, stat), out)
    return f"wrote {out} ({loaded.name}, {stat} per head)"
