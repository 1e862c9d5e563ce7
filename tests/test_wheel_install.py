"""The package as a user gets it: a wheel built from this tree, installed on its own (no
dependencies fetched: torch and the extras come from the environment running the tests), runs the
README's quick starts from a directory outside the repository."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from docs.doc_blocks import ROOT, python_blocks


@pytest.mark.slow
def test_wheel_installs_and_runs_the_readme_quick_starts(tmp_path):
    wheels, site, work = tmp_path / "wheels", tmp_path / "site", tmp_path / "work"
    work.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(wheels), str(ROOT)], check=True, timeout=300,
                   cwd=tmp_path)  # --no-index: nothing is downloaded, torch least of all
    wheel = next(wheels.glob("attnlab-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "attnlab/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert any(n.startswith("attnlab/viz/assets/") for n in names)  # the pages' own files
    assert any(n.endswith(".cpp") for n in names)  # the interval kernel's sources
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True, timeout=300, cwd=tmp_path)

    blocks = [b for b in python_blocks(ROOT / "README.md") if b.mark is None]
    assert len(blocks) >= 2
    script = "import attnlab, pathlib\nprint('FROM', pathlib.Path(attnlab.__file__).parent)\n"
    script += "\n".join(b.code for b in blocks)
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"FROM {site / 'attnlab'}" in done.stdout  # the installed copy, not the source tree
    assert (work / "view.html").stat().st_size > 10_000
