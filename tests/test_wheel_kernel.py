"""The platform wheel (`make wheel`, tools/build_wheel.py) carries the interval kernel: installed
on its own (torch from the environment, nothing downloaded) and run with no compiler on PATH and an
empty kernel cache, it loads the best prebuilt library this CPU runs, hash-checked, and
`attnlab.attention` runs it; `attnlab doctor` says it came from the wheel. A damaged library in
the wheel is refused and the kernel is built as without a wheel (here: no compiler, so the
PyTorch path, with a warning that names the hash)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attnlab.ops.kernels import build

ROOT = Path(__file__).resolve().parents[1]

RUN = """
import warnings, torch, attnlab, pathlib
from attnlab import masks
from attnlab.cli import main
from attnlab.ops.kernels import build
print("FROM", pathlib.Path(attnlab.__file__).parent)
q, k, v = (torch.randn(1, 4, 300, 32, generator=torch.Generator().manual_seed(i))
           for i in range(3))
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    c = attnlab.select_backend(q, k, v, mask=masks.sliding_window(40))
    print("CHOICE", c.backend, c.reason)
    if c.backend == "interval":
        out = attnlab.attention(q, k, v, mask=masks.sliding_window(40), backend="interval")
        want = attnlab.attention(q, k, v, mask=masks.sliding_window(40), backend="math")
        print("ERR", float((out - want).abs().max()))
print("WARN", [str(x.message) for x in w])
print("STATUS", build.status().reason)
main(["doctor", "--no-build"])
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if build.runnable()[0] != "avx512":
        pytest.skip("the wheel's three builds need a CPU that runs AVX-512")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import build_wheel
    finally:
        sys.path.pop(0)
    return build_wheel.build(tmp_path_factory.mktemp("dist"))


def _install(wheel: Path, site: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "install",
                    "--no-deps", "--no-index", "--target", str(site), str(wheel)], check=True,
                   timeout=300)


def _run(site: Path, tmp: Path) -> str:
    empty = tmp / "bin"  # PATH: no c++, no gcc, no ninja
    empty.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CC", "ATTNLAB_KERNEL",
                                                             "ATTNLAB_KERNEL_ISA")}
    env.update(PATH=str(empty), PYTHONPATH=str(site), ATTNLAB_CACHE_DIR=str(tmp / "cache"),
               OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", RUN], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_the_wheel_runs_the_kernel_with_no_compiler(wheel, tmp_path):
    assert wheel.name.endswith("-linux_x86_64.whl") and "-py3-none-any" not in wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    manifest = json.loads(zipfile.ZipFile(wheel).read(
        "attnlab/ops/kernels/prebuilt/manifest.json"))
    assert set(manifest["libraries"]) == {"avx512", "avx2", "scalar"}
    for entry in manifest["libraries"].values():
        assert f"attnlab/ops/kernels/prebuilt/{entry['file']}" in names
    _install(wheel, tmp_path / "site")
    out = _run(tmp_path / "site", tmp_path)
    assert f"FROM {tmp_path / 'site' / 'attnlab'}" in out
    assert "CHOICE interval" in out and "(avx512)" in out, out
    assert float(out.split("ERR ")[1].split()[0]) < 1e-5
    assert "STATUS loaded from the wheel (" in out and "prebuilt" in out, out
    assert "WARN []" in out, out
    doctor = out.split("STATUS")[1]
    assert "interval kernel" in doctor and "the wheel" in doctor, doctor
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.so"))


@pytest.mark.slow
def test_a_damaged_library_in_the_wheel_is_not_loaded(wheel, tmp_path):
    site = tmp_path / "site"
    _install(wheel, site)
    folder = site / "attnlab" / "ops" / "kernels" / "prebuilt"
    lib = folder / json.loads((folder / "manifest.json").read_text())["libraries"]["avx512"]["file"]
    lib.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2])  # truncated
    out = _run(site, tmp_path)
    assert "CHOICE interval" not in out, out
    assert "sha256" in out and "no C++ compiler" in out, out
