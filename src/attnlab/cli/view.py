"""`attnlab view TEXT -o FILE.html`: one self-contained interactive page (opens offline).

Head view (lines from each token to what it borrows, hover for percentages), model view (every
layer and head; click one), step view (q·k -> scaled -> masked -> softmax -> weighted sum for one
token and head, with the model's numbers), and PNG/SVG export. Nothing is fetched, ever.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub):
    p = sub.add_parser("view", help="write an offline, interactive HTML page of the attention",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", help="the text to run the model on")
    p.add_argument("-o", "--output", required=True, metavar="FILE.html",
                   help="where to write the page")
    p.add_argument("--model", metavar="PATH", default=None,
                   help="a local model directory (default: the packaged all-MiniLM-L6-v2)")
    return p


def run(args) -> int:
    from attnlab.adapters.quiet import quiet_transformers
    from attnlab.errors import AttnlabError
    from attnlab.explain.model import run_model
    from attnlab.viz.page import write_page

    out = Path(args.output)
    if out.suffix.lower() not in (".html", ".htm"):
        raise AttnlabError(f"-o: expected a file ending in .html, got {args.output!r}")
    if not out.parent.is_dir():
        raise AttnlabError(f"-o: no such directory {str(out.parent)!r}")
    quiet_transformers()  # no loading progress bars around our one line of output
    ma = run_model(args.text, args.model)
    write_page(ma, out, text=args.text)
    size = out.stat().st_size
    print(f"wrote {out} ({size / 1024:.0f} KiB, {ma.model_name}, {ma.n_layers} layers x "
          f"{ma.n_heads} heads, {len(ma.tokens)} tokens); open it in a browser, no network needed")
    return 0
