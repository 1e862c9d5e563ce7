"""`attnlab lesson`: the lessons' worked example, computed by the library."""

from __future__ import annotations

import json
import sys


def add_parser(sub):
    from attnlab.explain.lesson import SECTIONS

    p = sub.add_parser("lesson", help="replay the attention lesson with computed numbers",
                       description=__doc__)
    p.add_argument("--json", action="store_true", help="print the same content as JSON")
    p.add_argument("--section", choices=list(SECTIONS), help="show one section only")
    p.add_argument("--plain", action="store_true",
                   help="text only, no coloured bars/heatmaps (the default when not a terminal)")
    return p


def run(args) -> int:
    from attnlab.explain.lesson import build_lesson
    from attnlab.viz.lesson_text import render_lesson
    from attnlab.viz.terminal import wanted

    sections = build_lesson([args.section] if args.section else None)
    if args.json:
        json.dump({"sections": sections}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif wanted(args.plain):  # a terminal: the text plus coloured bars and heatmaps
        from attnlab.viz.terminal_reports import show_lesson

        show_lesson(sections)
    else:
        sys.stdout.write(render_lesson(sections))
    return 0
