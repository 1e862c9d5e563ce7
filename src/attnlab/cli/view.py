"""`attnlab view TEXT -o FILE.html`: one self-contained interactive page (opens offline).

Head view (lines from each token to what it borrows, hover for percentages), model view (every
layer and head; click one), step view (q·k -> scaled -> masked -> softmax -> weighted sum for one
token and head, with the model's numbers), and PNG/SVG export. Nothing is fetched, ever.

The page opens on the head `attnlab explain` ranks first for --token (default "it" when the text
has it, else its first word), that token pinned, with its percentages beside the keys.
"""

from __future__ import annotations

from attnlab.cli.options import (
    add_model,
    add_text,
    add_threads,
    check_output,
    check_words,
    command,
    open_model,
    run_text,
    vocabulary_notes,
)


def add_parser(sub):
    p = command(sub, "view", __doc__, "write an offline, interactive HTML page of the attention")
    add_text(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE.html",
                   help="where to write the page")
    p.add_argument("--token", metavar="WORD",
                   help='the word the page opens on, pinned, in the head explain ranks first for '
                   'it (or its token index; default "it" when the text has it, else its first '
                   'word)')
    add_model(p)
    add_threads(p)
    return p


def run(args) -> int:
    from attnlab.explain.page_payload import opening
    from attnlab.viz.page import write_page

    check_words(args)
    out = check_output("-o", args.output, (".html", ".htm"))
    loaded = open_model(args.model)
    ma = run_text(loaded, args.text)
    o = opening(ma, args.token)
    write_page(ma, out, text=args.text, token=args.token, walk=_walk(loaded, args.text, o))
    size = out.stat().st_size
    print(f"wrote {out} ({size / 1024:.0f} KiB, {ma.model_name}, {ma.n_layers} layers x "
          f"{ma.n_heads} heads, {len(ma.tokens)} tokens); open it in a browser, no network needed")
    print(f'it opens on layer {o["layer"]}, head {o["head"]}: the head explain ranks first for '
          f'"{ma.tokens[o["token"]]}" (token {o["token"]}), pinned')
    for w in vocabulary_notes(loaded, args.text):
        print(f"warning: {w}")
    return 0


def _walk(loaded, text: str, o: dict) -> dict | None:
    """The step view's layer walk for the opening (q from x, the heads through W_o, the residual,
    positions), or None for a model the walk does not know."""
    from attnlab.errors import AttnlabError
    from attnlab.explain.layer import layer_walk

    if not hasattr(loaded, "kind"):
        return None
    try:
        return layer_walk(loaded, text, layer=o["layer"], head=o["head"],
                          token=o["token"]).page_json()
    except AttnlabError:
        return None
