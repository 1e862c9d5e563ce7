"""`attnlab <command>`: a thin layer over the library. Each command lives in its own module here,
with `add_parser(subparsers)` (cheap: no heavy imports) and `run(args) -> int`."""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from attnlab.errors import AttnlabError

#: subcommand modules, in the order `--help` lists them
COMMANDS = ("lesson", "explain", "train", "generate", "plot", "view", "serve", "bench",
            "plan_cp", "heads", "rollout", "track_heads")


def build_parser() -> argparse.ArgumentParser:
    from attnlab import __version__

    parser = argparse.ArgumentParser(
        prog="attnlab",
        description="Attention, exactly and in the open: see the lesson's arithmetic, look inside "
        "real models, and benchmark attention kernels.",
    )
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"attnlab.cli.{name}")
        p = module.add_parser(sub)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0
    def one_line(message, category, *_args, **_kwargs):  # a warning is one line, like errors
        print(f"attnlab {args.command}: warning: {message}", file=sys.stderr)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = one_line
            return int(args._run(args) or 0)
    except AttnlabError as e:
        print(f"attnlab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"attnlab {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
