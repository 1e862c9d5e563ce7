"""`attnlab lesson`: the worked example of two lessons, "Attention Mechanisms: First Intuition"
(the idea without math) and "Attention Mechanisms: Why the Math Looks Like This" (why the dot
product, softmax, the weighted sum and 1/√d), computed by the library.

`--html` writes the same lesson as one explorable, offline page (drag the query, edit the numbers,
every percentage recomputed live): `attnlab lesson --html -o lesson.html`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnlab.cli.options import check_choice

#: the lesson's steps, as `attnlab.explain.lesson_sections.SECTIONS` names them (a test holds
#: the two together; `--help` imports no numpy)
SECTION_NAMES = "compare, normalize, scale, borrow, mask, heads, check"


def add_parser(sub):
    p = sub.add_parser("lesson", help="replay the attention lesson with computed numbers",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the same content as JSON")
    p.add_argument("--section", metavar="NAME",
                   help="show one section only (default: all): " + SECTION_NAMES)
    p.add_argument("--plain", action="store_true",
                   help="text only, no coloured bars/heatmaps (the default when not a terminal)")
    p.add_argument("--html", action="store_true",
                   help="write the explorable page instead (to -o FILE.html, or to stdout)")
    p.add_argument("-o", "--output", metavar="FILE.html",
                   help="where --html writes the page (default: stdout)")
    return p


def _write_html(args) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.viz.lesson_page import lesson_html, write_lesson_page

    if args.json or args.section or args.plain:
        used = [f for f, on in (("--json", args.json), ("--section", args.section),
                                ("--plain", args.plain)) if on]
        raise AttnlabError(f"--html: the page holds every section and is not text; drop "
                           f"{', '.join(used)}")
    if args.output is None:
        sys.stdout.write(lesson_html())
        return 0
    out = Path(args.output)
    if out.suffix.lower() not in (".html", ".htm"):
        raise AttnlabError(f"-o: expected a file ending in .html, got {args.output!r}")
    if not out.parent.is_dir():
        raise AttnlabError(f"-o: no such directory {str(out.parent)!r}")
    write_lesson_page(out)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB); open it in a browser, no network "
          "needed")
    return 0


def run(args) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.explain.lesson_sections import SECTIONS, build_lesson
    from attnlab.viz.lesson_text import intro, render_lesson
    from attnlab.viz.terminal import wanted

    check_choice("--section", args.section, list(SECTIONS))
    if args.html:
        return _write_html(args)
    if args.output is not None:
        raise AttnlabError(f"-o {args.output}: only --html writes a file; add --html")
    sections = build_lesson([args.section] if args.section else None)
    if args.json:
        json.dump({"sections": [s.to_json() for s in sections]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif wanted(args.plain):  # a terminal: the text plus coloured bars and heatmaps
        from attnlab.viz.terminal_reports import show_lesson

        if not args.section:
            sys.stdout.write(intro())
        show_lesson(sections)
    else:
        sys.stdout.write((intro() if not args.section else "") + render_lesson(sections))
    return 0
