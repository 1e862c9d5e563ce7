"""MkDocs hook: the parts of the docs that are generated at build time, so they cannot drift.

- `<!-- cli-reference -->` becomes the CLI reference, built from the argparse parsers
  (`attnlab.cli.build_parser`): every command's `--help`, as `attnlab COMMAND --help` prints it.
- `<!-- run: attnlab ARGS -->` becomes a text block with that command and what it prints, run
  in this process through `attnlab.cli.main` (so the numbers shown are the ones computed now);
  `<!-- run-md: attnlab ARGS -->` inserts the output as Markdown (for commands printing tables).
  A run directory named in `CACHED_RUNS` ("runs/induction") is a preset trained once into the
  cache (`attnlab.models.cached_run`): the first build trains it, later builds read it.
- `pages/lesson.html` and `pages/view.html` are the real explorable page and a real view page
  (`attnlab lesson --html`, `attnlab view TEXT --token it`), written into the site; the pictures
  of them in docs/img (the README's too) are taken from those pages by headless Chromium on every
  build (`pictures.py`), so they show the pages as they are now.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import tempfile
from pathlib import Path

RUN = re.compile(r"^<!-- run(-md)?: attnlab (.*?) -->$", re.M)
_outputs: dict[str, str] = {}
#: run directories the pages' commands name -> (preset, steps) trained into the cache
CACHED_RUNS = {"runs/induction": ("induction", 1500)}


def _cached_runs(args: str) -> tuple[str, dict[str, str]]:
    """`args` with each cached run's name replaced by its path; {directory name: shown name}."""
    names = {}
    for shown, (preset, steps) in CACHED_RUNS.items():
        if shown in args:
            from attnlab.models.cached_run import cached_run

            path = cached_run(preset, max_steps=steps)
            args = args.replace(shown, str(path))
            names[path.name] = shown
    return args, names


def cli_reference() -> str:
    """One section per command: its one-line help, then its `--help` verbatim."""
    os.environ["COLUMNS"] = "100"  # argparse wraps help at the terminal's width
    from attnlab.cli import build_parser

    parser = build_parser()
    out = ["## attnlab", "", "```text", parser.format_help().rstrip(), "```", ""]
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        out += [f"## attnlab {name}", "", parser.command_help[name], "", "```text",
                p.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def run_command(args: str, markdown: bool = False) -> str:
    """`attnlab ARGS` run here; its stdout (it must exit 0), as a text block or as Markdown."""
    if args not in _outputs:
        os.environ["COLUMNS"] = "100"
        import torch

        from attnlab.cli import main

        torch.set_num_threads(1)  # small work: one thread is fastest, and never collapses

        real, names = _cached_runs(args)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main(shlex.split(real))
        if code != 0:
            raise RuntimeError(f"attnlab {args}: exit code {code}")
        text = buf.getvalue().rstrip()
        for name, shown in names.items():
            text = text.replace(name, shown)
        _outputs[args] = text
    if markdown:  # a title line of the output ("# ...") is a caption here, not a heading
        body = re.sub(r"^# (.*)$", r"*\1*", _outputs[args], flags=re.M)
        return f"`attnlab {args}`\n\n{body}"
    return f"```text\n$ attnlab {args}\n{_outputs[args]}\n```"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "<!-- cli-reference -->" in markdown:
        markdown = markdown.replace("<!-- cli-reference -->", cli_reference())
    return RUN.sub(lambda m: run_command(m.group(2), markdown=bool(m.group(1))), markdown)


_PAGES: dict[str, Path] = {}


def _pictures():
    spec = importlib.util.spec_from_file_location("docs_pictures",
                                                  Path(__file__).with_name("pictures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_pre_build(config) -> None:
    """The real pages, into a temporary folder, and the pictures of them, into docs/img."""
    pictures = _pictures()
    where = Path(tempfile.mkdtemp(prefix="attnlab-docs-pages-"))
    _PAGES.update(pictures.write_pages(where / "pages"))
    pictures.take_pictures(_PAGES, Path(config["docs_dir"]) / "img")


def on_files(files, config):
    """The real pages join the site as pages/lesson.html and pages/view.html."""
    from mkdocs.structure.files import File

    for name, path in _PAGES.items():
        files.append(File(f"pages/{name}.html", src_dir=str(path.parent.parent),
                          dest_dir=config["site_dir"], use_directory_urls=False))
    return files
