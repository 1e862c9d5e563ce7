"""`attnlab <command>`: a thin layer over the library. Each command lives in its own module here,
with `add_parser(subparsers)` (cheap: no heavy imports) and `run(args) -> int`; `options` holds
what the commands share (`--model`, `--threads`, the checks of text and output arguments made
before a model loads, the quiet -> load -> run opening, the preset settings train and track-heads
override); `train` runs on train_start (its Trainer from the arguments), train_report (what a run
prints) and train_processes (the launcher and its workers). Errors are one line and exit 2;
warnings one line.

One vocabulary across commands: `--model DIR` reads a model or a run directory, `--out DIR` writes
one, `-o FILE` writes a file, `--layer` / `--head` are 0-based indices (negative counts from the
last), `--threads N` (default 1) on every command that computes."""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
import warnings

from attnlab.errors import AttnlabError

#: the commands `--help` lists, by what they are for (module names)
GROUPS = (
    ("learn", ("lesson",)),
    ("look inside a model", ("explain", "heads", "rollout", "plot", "view", "serve")),
    ("what heads matter for", ("ablate", "patch")),
    ("build and train", ("train", "generate", "track_heads")),
    ("scale", ("plan_cp",)),
    ("tools", ("bench", "doctor")),
)
COMMANDS = tuple(name for _, names in GROUPS for name in names)

MAX_THREADS = 1024  # as `attnlab train` allows its processes

DESCRIPTION = ("Attention, exactly and in the open: see the lesson's arithmetic, look inside "
               "real models, train a small GPT, plan attention across machines, and benchmark "
               "attention kernels.")


class _Help(argparse.HelpFormatter):
    """Every option's help ends with its default (unless it says it already)."""

    def _get_help_string(self, action):
        text = action.help or ""
        unset = action.default is None or action.default is False \
            or action.default == argparse.SUPPRESS
        if action.option_strings and not unset and "default" not in text and action.nargs != 0:
            value = action.default
            if isinstance(value, (list, tuple)):
                value = " ".join(map(str, value))
            text = f"{text} (default: {str(value).replace('%', '%%')})".strip()
        return text


class _RawHelp(argparse.RawDescriptionHelpFormatter, _Help):
    pass


def build_parser() -> argparse.ArgumentParser:
    from attnlab import __version__

    parser = argparse.ArgumentParser(prog="attnlab",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                help="one of the commands above")
    helps = {}
    for name in COMMANDS:
        module = importlib.import_module(f"attnlab.cli.{name}")
        p = module.add_parser(sub)
        p.set_defaults(_run=module.run)
        p.formatter_class = _RawHelp  # every description as written: paragraphs, examples
        helps[p.prog.split()[-1]] = sub._choices_actions[-1].help
    sub._choices_actions.clear()  # listed below, by group, instead of in one flat list
    width = max(map(len, helps)) + 2
    lines = [textwrap.fill(DESCRIPTION, 79), ""]
    for title, names in GROUPS:
        lines.append(f"{title}:")
        lines += [f"  {n.replace('_', '-'):<{width}}{helps[n.replace('_', '-')]}" for n in names]
        lines.append("")
    lines.append("attnlab COMMAND --help shows a command's options.")
    parser.description = "\n".join(lines)
    parser.command_help = helps  # for the docs' CLI reference
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):  # no command: what there is, and a usage error
        parser.print_help(sys.stderr)
        return 2

    def one_line(message, category, *_args, **_kwargs):  # a warning is one line, like errors
        print(f"attnlab {args.command}: warning: {message}", file=sys.stderr)

    try:
        _set_threads(getattr(args, "threads", None))
        with warnings.catch_warnings():
            warnings.showwarning = one_line
            return int(args._run(args) or 0)
    except AttnlabError as e:
        print(f"attnlab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"attnlab {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `attnlab lesson | head`: the reader has read enough
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


def _set_threads(n: int | None) -> None:
    """--threads: torch's intra-op threads for this process (None: a command without it)."""
    if n is None:
        return
    if isinstance(n, bool) or n < 1:
        raise AttnlabError(f"--threads: expected a positive number, got {n}")
    if n > MAX_THREADS:
        raise AttnlabError(f"--threads: {n} is beyond the limit of {MAX_THREADS}")
    import torch

    torch.set_num_threads(n)


if __name__ == "__main__":
    sys.exit(main())
