"""`attnlab lesson`: the worked example of two lessons, "Attention Mechanisms: First Intuition"
(the idea without math) and "Attention Mechanisms: Why the Math Looks Like This" (why the dot
product, softmax, the weighted sum and 1/√d), computed by the library.

`--html` writes the same lesson as one explorable, offline page (drag the query, edit the numbers,
every percentage recomputed live): `attnlab lesson --html -o lesson.html`.
"""

from __future__ import annotations

import json
import sys

from attnlab.cli.options import (
    add_model,
    check_choice,
    check_output,
    check_text,
    command,
    open_model,
    run_text,
)

#: the lesson's steps, as `attnlab.explain.lesson_sections.SECTIONS` names them (a test holds
#: the two together; `--help` imports no numpy)
SECTION_NAMES = "compare, normalize, scale, borrow, mask, heads, check"
#: past the two lessons: one token through a whole attention layer of a real model
PAST = "layer"
TEXT = "The cat sat on the mat because it was tired."


def add_parser(sub):
    p = command(sub, "lesson", __doc__, "replay the attention lesson with computed numbers")
    p.add_argument("--json", action="store_true", help="print the same content as JSON")
    p.add_argument("--section", metavar="NAME",
                   help="show one section only (default: all): " + SECTION_NAMES + ", " + PAST +
                   " (past one head: q, k, v from x, the heads through W_o, the residual, the "
                   "layer norm and positions, in a real model)")
    add_model(p, help="the model of the layer section (default: the packaged all-MiniLM-L6-v2; "
              "or a checkpoint attnlab trained)")
    p.add_argument("--text", default=TEXT,
                   help=f"the layer section's text (default: {TEXT!r})")
    p.add_argument("--token", default="it", metavar="WORD",
                   help='the layer section\'s token (default "it"), through the layer and head '
                   "explain ranks first for it")
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
    out = check_output("-o", args.output, (".html", ".htm"))
    write_lesson_page(out)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB); open it in a browser, no network "
          "needed")
    return 0


def run(args) -> int:
    from attnlab.errors import AttnlabError
    from attnlab.explain.lesson_sections import SECTIONS, build_lesson
    from attnlab.viz.lesson_text import intro, render_lesson
    from attnlab.viz.terminal import wanted

    check_choice("--section", args.section, [*SECTIONS, PAST])
    if args.html:
        return _write_html(args)
    if args.output is not None:
        raise AttnlabError(f"-o {args.output}: only --html writes a file; add --html")
    check_text("--text", args.text)
    check_text("--token", args.token)
    toy = args.section != PAST
    sections = build_lesson([args.section] if args.section else None) if toy else []
    walk = _walk(args) if args.section in (None, PAST) else None
    if args.json:
        doc = {"sections": [s.to_json() for s in sections]}
        if walk is not None:
            doc["layer"] = walk.to_json()
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if args.section == PAST:
        from attnlab.viz.layer_text import render_layer

        sys.stdout.write(render_layer(walk))
        return 0
    elif wanted(args.plain):  # a terminal: the text plus coloured bars and heatmaps
        from attnlab.viz.terminal_reports import show_lesson

        if not args.section:
            sys.stdout.write(intro())
        show_lesson(sections)
    else:
        sys.stdout.write((intro() if not args.section else "") + render_lesson(sections))
    if walk is not None:
        from attnlab.viz.layer_text import render_layer

        sys.stdout.write(f"\n{len(sections) + 1}. " + render_layer(walk))
    return 0


def _walk(args):
    """The layer section: the token through the head explain ranks first for it."""
    from attnlab.explain.layer import layer_walk
    from attnlab.explain.page_payload import opening

    loaded = open_model(args.model)
    o = opening(run_text(loaded, args.text), args.token, loaded.special_tokens or None)
    return layer_walk(loaded, args.text, layer=o["layer"], head=o["head"], token=o["token"])
