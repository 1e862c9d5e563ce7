"""`attnlab serve`: a local web app; type a sentence, pick model, layer, head and token.

Listens on 127.0.0.1 (this machine only) unless --host says otherwise. The models are loaded
once and stay loaded. Stop with Ctrl-C.
"""

from __future__ import annotations

import sys

from attnlab.cli.options import add_threads, command


def add_parser(sub):
    from attnlab.viz.app_server import MAX_CHARS, MAX_TOKENS

    p = command(sub, "serve", __doc__, "run the local web app (loopback only by default)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free one)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; anything else exposes the app)")
    p.add_argument("--model", metavar="PATH", action="append", default=[],
                   help="a local model directory to offer (repeatable; the packaged "
                        "all-MiniLM-L6-v2 is always offered first)")
    p.add_argument("--max-chars", type=int, default=MAX_CHARS,
                   help=f"longest text accepted (default {MAX_CHARS})")
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS,
                   help=f"most tokens accepted (default {MAX_TOKENS})")
    add_threads(p)
    return p


def run(args) -> int:
    from pathlib import Path

    from attnlab.adapters.quiet import quiet_transformers
    from attnlab.errors import AttnlabError
    from attnlab.explain.model import DEFAULT_MODEL
    from attnlab.viz.app import Models, is_loopback, make_server

    if not 0 <= args.port <= 65535:
        raise AttnlabError(f"--port: expected 0..65535, got {args.port}")
    if args.max_chars < 1 or args.max_tokens < 1:
        raise AttnlabError(f"--max-chars/--max-tokens: expected positive numbers, got "
                           f"{args.max_chars}, {args.max_tokens}")
    choices: dict[str, str | None] = {DEFAULT_MODEL: None}
    for path in args.model:
        choices[Path(path).name or path] = path
    models = Models(choices)
    try:  # bind first: a busy port is reported before seconds of model loading
        server = make_server(models, args.host, args.port, max_chars=args.max_chars,
                             max_tokens=args.max_tokens)
    except OSError as e:
        raise AttnlabError(f"--host {args.host} --port {args.port}: cannot listen ({e})") from None
    quiet_transformers()
    print(f"loading {DEFAULT_MODEL} ...", file=sys.stderr)
    models.get(DEFAULT_MODEL)  # the first request should not wait seconds for the model
    host = f"[{args.host}]" if ":" in args.host else args.host
    if not is_loopback(args.host):
        print(f"warning: listening on {args.host}, reachable from other machines; the app has "
              "no authentication", file=sys.stderr)
    print(f"attnlab app on http://{host}:{server.server_port}/ (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
