"""The `attnlab` command: --help, --version, the lesson, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import attnlab
from attnlab.cli import main


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and attnlab.__version__ in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "lesson" in capsys.readouterr().out


def test_lesson_prints_computed_scores(capsys):
    assert main(["lesson"]) == 0
    out = capsys.readouterr().out
    assert "2*3 + 1*1 = 7" in out and "2*0 + 1*4 = 4" in out and "2*1 + 1*1 = 3" in out


def test_lesson_json_section(capsys):
    assert main(["lesson", "--json", "--section", "compare"]) == 0
    data = json.loads(capsys.readouterr().out)
    (section,) = data["sections"]
    assert [r["score"] for r in section["rows"]] == [7.0, 4.0, 3.0]


def test_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "attnlab", "--version"], capture_output=True,
                       text=True, check=True)
    assert r.stdout.strip() == f"attnlab {attnlab.__version__}"


def test_a_closed_pipe_ends_quietly(monkeypatch):
    """`attnlab lesson | head -1`: when the reader has gone, the command ends with 0 and no
    traceback (stdout here: a line-buffered pipe whose reading end is closed)."""
    import os
    import sys

    r, w = os.pipe()
    os.close(r)
    out = os.fdopen(w, "w", buffering=1)
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["lesson", "--section", "compare", "--plain"]) == 0
    out.close()
