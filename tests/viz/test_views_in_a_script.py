"""head_view / model_view in a plain script: nothing can show the page, so they say how to save
it (and return it) instead of printing `<IPython.core.display.HTML object>`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import torch
from attnlab.viz import head_view, model_view, save
w = torch.softmax(torch.randn(1, 2, 4, 4), -1)
page = head_view((w, w), ["a", "b", "c", "d"])
model_view((w, w), ["a", "b", "c", "d"])
print("saved", save(page, "view.html").stat().st_size > 1000)
"""


def test_views_in_a_script_say_how_to_save(tmp_path):
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "IPython" not in done.stdout + done.stderr
    assert done.stdout.strip() == "saved True"
    assert 'attnlab.viz.save(head_view(..., html_action="return"), "view.html")' in done.stderr
    assert 'attnlab.viz.save(model_view(' in done.stderr
