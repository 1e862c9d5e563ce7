"""Every python block of README.md and docs/ runs as written (see doc_blocks.py for the two
marks that change that). The blocks of one page run in order in one namespace, like a notebook,
in a fresh directory; pages share this process, so the bundled model loads once."""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import subprocess
import sys
import warnings

import pytest

from docs.doc_blocks import ROOT, pages, python_blocks

ALL = {str(p.relative_to(ROOT)): python_blocks(p) for p in pages()}
IN_PROCESS = sorted(page for page, blocks in ALL.items() if any(b.mark is None for b in blocks))
RUN_AS = [b for blocks in ALL.values() for b in blocks if b.mark == "run-as"]


def test_blocks_are_found_and_marks_have_reasons():
    assert sum(len(b) for b in ALL.values()) >= 20
    for blocks in ALL.values():
        for b in blocks:
            if b.mark == "no-run":
                assert len(b.arg) >= 10, f"{b.page}:{b.line}: no-run needs a reason"


@pytest.mark.parametrize("page", IN_PROCESS)
def test_page_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    for b in ALL[page]:
        if b.mark is not None:
            continue
        code = compile(b.code, f"{page}:{b.line}", "exec")
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(code, namespace)  # a failure names the page and the block's line


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN_AS, ids=lambda b: f"{b.page}:{b.line}")
def test_launched_examples_run(block, tmp_path):
    *command, filename = shlex.split(block.arg)
    (tmp_path / filename).write_text(block.code, encoding="utf-8")
    if command[0] == "torchrun":  # the same launcher, without relying on the script being on PATH
        command = [sys.executable, "-m", "torch.distributed.run", *command[1:]]
    elif command[0] == "python":
        command = [sys.executable, *command[1:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*command, filename], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"{block.page}:{block.line}\n{done.stderr[-3000:]}"
