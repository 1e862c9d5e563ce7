"""What the commands share: the `--model` option, the checks of their text and output arguments
(made before the model loads: loading and running take seconds), the opening quiet → load → run,
and the options that override a training preset's settings (train, track-heads).

    add_model(p)                         # --model PATH, default: the packaged all-MiniLM-L6-v2
    add_text_token(p, "the word to ...")  # TEXT, --token WORD, --model
    check_text("TEXT", args.text)        # one-line error for text that is not UTF-8
    check_words(args)                    # the same for TEXT, --token, --target where given
    out = check_output("-o", args.output, (".png", ".svg"))
    loaded = open_model(args.model)      # transformers quiet, the model loaded (cached)
    att = run_text(loaded, args.text)    # every layer's and head's attention on the text
    att = run_text(args.model, args.text)  # the same, loading on the way
    add_preset_setting(p, "--seed", "S", "seed of ...")  # default None: the preset's
    Trainer.start(preset, **preset_settings(args))      # {"seed": 3} for those given

Imports of the library happen inside the functions: `attnlab --help` builds every parser without
loading numpy or torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.errors import AttnlabError

MODEL_HELP = ("a local Hugging Face model directory or a checkpoint attnlab trained (default: "
              "the packaged all-MiniLM-L6-v2)")


def print_result(as_json: bool, data, text) -> None:
    """A command's result on stdout: `data()` as JSON with --json, else the string `text()` (both
    callables, so that only the form printed is made)."""
    if as_json:
        import json

        json.dump(data(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text())


def add_model(p, *, help: str = MODEL_HELP):
    """Add `--model PATH` (the model the command reads) to parser `p`; returns the action."""
    return p.add_argument("--model", metavar="PATH", default=None, help=help)


def check_text(name: str, text: str) -> str:
    """`text` as given on the command line, refused when it is not UTF-8 (Python keeps such bytes
    as lone surrogates, which no tokenizer takes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = ord(text[e.start])
        byte = f"byte 0x{bad - 0xDC00:02x}" if 0xDC80 <= bad <= 0xDCFF else f"U+{bad:04X}"
        raise AttnlabError(f"{name}: not UTF-8 text ({byte} at character {e.start} of "
                           f"{text[:e.start]!r}...); pass the text in UTF-8") from None
    return text


def read_lines(name: str, path: str) -> list[str]:
    """The non-empty lines of a UTF-8 text file, stripped."""
    p = Path(path)
    if not p.is_file():
        raise AttnlabError(f"{name} {path}: no such file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise AttnlabError(f"{name} {path}: not UTF-8 text ({e.reason} at byte {e.start}); "
                           "expected one text per line") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def check_output(name: str, path: str, suffixes: tuple[str, ...]) -> Path:
    """The file a command will write, checked before any work: its suffix, and its folder."""
    out = Path(path)
    if out.suffix.lower() not in suffixes:
        what = " or ".join(suffixes)
        raise AttnlabError(f"{name}: expected a file ending in {what}, got {path!r}")
    if not out.parent.is_dir():
        raise AttnlabError(f"{name}: no such directory {str(out.parent)!r}")
    return out


def open_model(model: str | None):
    """Quiet transformers' progress bars, then load `model` (the --model value; None: the
    default), cached by path."""
    from attnlab.adapters.quiet import quiet_transformers
    from attnlab.explain.model import load_model

    quiet_transformers()  # no loading progress bars around our output
    return load_model(model)


def run_text(model, text: str):
    """The attention of `model` (a loaded model from `open_model`, or the --model value) on
    `text`, every layer and head, as a ModelAttention."""
    from attnlab.adapters.quiet import quiet_transformers
    from attnlab.explain.model import run_model

    quiet_transformers()
    return run_model(text, model)


def vocabulary_notes(loaded, text: str) -> list[str]:
    """What the tokenizer of `loaded` (from `open_model`) lost of `text`: accents, words that
    became [UNK] (`attnlab.explain.vocabulary`); none for a model attnlab trained."""
    from attnlab.explain.vocabulary import vocabulary_warnings

    tok = getattr(loaded, "tokenizer", None)
    if getattr(loaded, "kind", None) != "hf" or not hasattr(tok, "tokenize"):
        return []
    return vocabulary_warnings(text, tok.tokenize, getattr(tok, "unk_token", None), loaded.name)


def check_choice(name: str, value: str | None, choices) -> str | None:
    """`value` (None: not given) as one of `choices`, checked where the command runs: the names
    live with what they name, which `--help` does not import."""
    if value is not None and value not in choices:
        raise AttnlabError(f"{name} {value!r}: expected one of {', '.join(choices)}")
    return value


THREADS_HELP = ("torch threads for this command (default 1: on a machine shared with other jobs "
                "more threads can wait on each other and run many times slower; give the number "
                "of idle cores to use them)")


def add_threads(p, *, help: str = THREADS_HELP):
    """Add `--threads N` (default 1); `attnlab.cli.main` applies it before the command runs."""
    return p.add_argument("--threads", type=int, default=1, metavar="N", help=help)


#: the settings of a training preset (TrainConfig; --dropout: the model's) that `attnlab train`
#: and `attnlab track-heads` let the command line override, by option, with the type each takes
PRESET_SETTINGS = {"--max-steps": int, "--seed": int, "--batch-size": int, "--eval-interval": int,
                   "--lr": float, "--min-lr": float, "--warmup-steps": int, "--dropout": float,
                   "--repeat-prob": float}


def add_preset_setting(p, flag: str, metavar: str | None, help: str):
    """Add `flag` (one of PRESET_SETTINGS), overriding the preset's setting of that name
    (`--max-steps`: max_steps): default None, which leaves the preset's value; a `help` that does
    not say its default ends with "(default: the preset's)"."""
    if "default" not in help:
        help = f"{help} (default: the preset's)"
    return p.add_argument(flag, type=PRESET_SETTINGS[flag], default=None, metavar=metavar,
                          help=help)


def preset_settings(args, *flags: str) -> dict:
    """{setting: value} of the `flags` (PRESET_SETTINGS; all of them when none are named) that
    the command line gave; those it left out keep the preset's values."""
    dests = [f[2:].replace("-", "_") for f in flags or PRESET_SETTINGS]
    return {d: getattr(args, d) for d in dests if getattr(args, d, None) is not None}


class _Deprecated(argparse.Action):
    """An old spelling of an option: stores into the new one's dest and says so on stderr."""

    def __init__(self, option_strings, dest, *, new: str, **kwargs):
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: warning: {option_string} is deprecated; use {self.new}",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_alias(p, old: str, new_action) -> None:
    """Keep `old` working as a hidden spelling of `new_action`'s option (one warning line)."""
    p.add_argument(old, dest=new_action.dest, metavar=new_action.metavar, type=new_action.type,
                   nargs=new_action.nargs, action=_Deprecated, new=new_action.option_strings[-1],
                   help=argparse.SUPPRESS)


def command(sub, name: str, doc: str | None, help: str, **kw):
    """The parser of one `attnlab NAME` command: its one-line help in the command list, its
    module docstring as the description (`cli.build_parser` prints every description as
    written)."""
    return sub.add_parser(name, help=help, description=doc, **kw)


def add_text(p, help: str = "the text to run the model on", **kw) -> None:
    """The TEXT positional of the commands that run a model on a text."""
    p.add_argument("text", help=help, **kw)


def add_text_token(p, token_help: str) -> None:
    """TEXT, `--token WORD` (required) and `--model`, in that order: the opening of the commands
    that follow one token of a text through a model (explain, rollout)."""
    add_text(p)
    p.add_argument("--token", required=True, metavar="WORD", help=token_help)
    add_model(p)


def check_words(args) -> None:
    """TEXT, --token and --target, those the command has and was given, as UTF-8 text (checked
    before the model loads)."""
    for name, dest in (("TEXT", "text"), ("--token", "token"), ("--target", "target")):
        if getattr(args, dest, None) is not None:
            check_text(name, getattr(args, dest))
