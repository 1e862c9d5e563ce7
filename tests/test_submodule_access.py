"""After a bare `import attnlab`, the dotted names the docs use resolve (submodules import on first
use), in a fresh interpreter where nothing imported them before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.parametrize("expr", [
    "attnlab.adapters.recording.record",
    "attnlab.adapters.hf.register",
    "attnlab.explain.training.track_heads",
    "attnlab.explain.model.load_model",
    "attnlab.reference.attention",
])
def test_dotted_name_after_import_attnlab(expr):
    code = f"import attnlab\nprint(callable({expr}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-500:]
