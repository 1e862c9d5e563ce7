"""The kernel cache trusts nothing: folders made 0700, owner and modes checked from the library up
to the cache root, the sha256 recorded at build time checked before dlopen, fsync before the
rename; a damaged library is rebuilt, a foreign one left alone (PyTorch path), one warning each,
never a load of a bad file (and so never a SIGBUS)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from attnlab.ops import kernels
from attnlab.ops.kernels import build, trust

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
need_root = pytest.mark.skipif(not ROOT, reason="giving a file to another uid needs root")
NOBODY = 65534


class Fake:
    """A build whose compile writes `payload` and whose dlopen is recorded, not done."""

    def __init__(self, monkeypatch, payload=b"\x7fELF a whole library"):
        self.compiled, self.opened, self.payload = 0, [], payload
        monkeypatch.setattr(build, "_names", lambda isa: ("attnlab_trust_fake", "attnlab_fake"))
        monkeypatch.setattr(build, "_has_ns", lambda ns: False)
        monkeypatch.setattr(build, "_ops", lambda ns: "ops")
        monkeypatch.setattr(build, "_compile", self._compile)
        monkeypatch.setattr(build, "_dlopen", lambda lib: self.opened.append(lib.read_bytes()))
        monkeypatch.setenv("ATTNLAB_KERNEL_ISA", "scalar")
        monkeypatch.setattr(build, "runnable", lambda: kernels.ISAS)
        self.lib = build.cache_root() / build.build_key("scalar") / "attnlab_trust_fake.so"

    def _compile(self, isa, name, ns, build_dir):
        self.compiled += 1
        (build_dir / f"{name}.so").write_bytes(self.payload)

    def load(self):
        """(ops or None, the RuntimeWarnings raised) of one fresh load."""
        build._LOADED.clear()
        build._FAILED.clear()
        build._WARNED.clear()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            ops = build.get()
        return ops, [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]


@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "_LOADED", {})
    monkeypatch.setattr(build, "_FAILED", {})
    monkeypatch.setattr(build, "_WARNED", set())
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    f = Fake(monkeypatch)
    ops, warned = f.load()
    assert ops == "ops" and warned == [] and f.compiled == 1 and f.opened == [f.payload]
    f.opened.clear()
    return f


def mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_a_build_is_private_and_its_hash_recorded(fake):
    for p in (build.cache_base(), build.cache_root(), fake.lib.parent):
        assert mode(p) == 0o700, (p, oct(mode(p)))
    assert trust.hash_record(fake.lib).read_text().strip() == trust.sha256_file(fake.lib)
    ops, warned = fake.load()  # the cached build, checked, then opened
    assert ops == "ops" and warned == [] and fake.compiled == 1
    assert fake.opened == [fake.payload]


def test_a_cache_home_not_made_yet_is_made(monkeypatch, tmp_path):
    """A home without ~/.cache (a container's user, pip run with --no-cache-dir): the folders
    above the cache root are made too, and the kernel builds and loads."""
    for name in ("_LOADED", "_FAILED"):
        monkeypatch.setattr(build, name, {})
    monkeypatch.setattr(build, "_WARNED", set())
    monkeypatch.delenv("ATTNLAB_CACHE_DIR", raising=False)
    home = tmp_path / "home" / ".cache"  # neither exists yet
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    f = Fake(monkeypatch)
    ops, warned = f.load()
    assert ops == "ops" and warned == [] and f.compiled == 1 and f.opened == [f.payload]
    assert build.cache_base() == home / "attnlab" and f.lib.exists()
    assert mode(home) == 0o700 and mode(build.cache_base()) == 0o700


def test_files_and_folder_are_synced_before_the_rename(monkeypatch, tmp_path):
    events = []
    monkeypatch.setattr(trust, "fsync", lambda p: events.append(("fsync", Path(p).name)))
    real = os.rename
    monkeypatch.setattr(trust.os, "rename", lambda a, b: (events.append(("rename", "")),
                                                          real(a, b)))
    tmp = tmp_path / "b.tmp"
    tmp.mkdir()
    (tmp / "x.so").write_bytes(b"lib")
    trust.record(tmp / "x.so")
    events.clear()
    trust.durable(tmp, tmp_path / "b")
    names = [n for _, n in events]
    at = events.index(("rename", ""))
    assert {"x.so", "x.so.sha256", "b.tmp"} <= set(names[:at]), events
    assert names[at + 1:] == [tmp_path.name]  # the parent's entry after it


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "no record"])
def test_a_damaged_library_is_rebuilt_never_loaded(fake, damage):
    data = fake.lib.read_bytes()
    if damage == "truncated":
        fake.lib.write_bytes(data[: len(data) // 2])
    elif damage == "flipped byte":
        fake.lib.write_bytes(data[:5] + bytes([data[5] ^ 1]) + data[6:])
    else:
        trust.hash_record(fake.lib).unlink()
    ops, warned = fake.load()
    assert ops == "ops" and fake.compiled == 2
    assert fake.opened == [fake.payload]  # only the rebuilt, whole library was opened
    assert len(warned) == 1 and "rebuilt" in warned[0], warned
    want = "no hash was recorded" if damage == "no record" else "truncated or modified"
    assert want in warned[0]


def test_a_damaged_library_without_a_compiler_falls_back(fake, monkeypatch):
    fake.lib.write_bytes(fake.lib.read_bytes()[:3])
    monkeypatch.setenv("CXX", "no-such-compiler-attnlab")
    ops, warned = fake.load()
    assert ops is None and fake.opened == [] and len(warned) == 1, warned
    assert "truncated or modified" in warned[0] and "no C++ compiler" in warned[0]


def _foreign(path: Path, how: str) -> None:
    if how == "owner":
        os.chown(path, NOBODY, -1)
    else:
        os.chmod(path, mode(path) | (stat.S_IWGRP if how == "group" else stat.S_IWOTH))


@pytest.mark.parametrize("where, how", [
    pytest.param("lib", "owner", marks=need_root),
    pytest.param("record", "owner", marks=need_root),
    pytest.param("build folder", "owner", marks=need_root),
    pytest.param("cache root", "owner", marks=need_root),
    ("lib", "group"),
    ("build folder", "group"),
    ("kernels folder", "group"),
    ("cache root", "world"),
])
def test_a_foreign_library_or_folder_is_never_loaded_nor_touched(fake, where, how):
    path = {"lib": fake.lib, "record": trust.hash_record(fake.lib),
            "build folder": fake.lib.parent, "kernels folder": build.cache_root(),
            "cache root": build.cache_base()}[where]
    _foreign(path, how)
    before = fake.lib.read_bytes()
    ops, warned = fake.load()
    assert ops is None and fake.opened == [] and fake.compiled == 1
    assert len(warned) == 1 and "not trusted" in warned[0], warned
    assert str(path) in warned[0]
    assert ("uid 65534" if how == "owner" else "writable by its group or by others") in warned[0]
    assert fake.lib.read_bytes() == before  # left as it was


@need_root
def test_a_foreign_cache_is_not_built_into(monkeypatch, tmp_path):
    """A cache root someone else made (a shared folder): no build goes there either."""
    base = tmp_path / "shared"
    base.mkdir()
    os.chown(base, NOBODY, -1)
    monkeypatch.setattr(build, "_LOADED", {})
    monkeypatch.setattr(build, "_FAILED", {})
    monkeypatch.setattr(build, "_WARNED", set())
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(base))
    f = Fake(monkeypatch)
    ops, warned = f.load()
    assert ops is None and f.compiled == 0 and len(warned) == 1 and "uid 65534" in warned[0]


def test_check_hash_is_reusable(tmp_path):
    p = tmp_path / "lib.so"
    p.write_bytes(b"abc")
    trust.check_hash(p, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    with pytest.raises(trust.Untrusted, match="truncated or modified"):
        trust.check_hash(p, "00" * 32)


def _real_build() -> Path:
    st = kernels.status(build=True)
    if not st.built:
        pytest.skip(f"the kernel is not buildable here: {st.reason}")
    return Path(st.cache)


CHILD = """
import warnings, torch
warnings.simplefilter("always")
import attnlab
from attnlab.ops import kernels
print("available", kernels.available())
q = torch.randn(1, 2, 8, 16)
out = attnlab.attention(q, q, q, is_causal=True)
print("finite", bool(torch.isfinite(out).all()))
"""


def _child(cache: Path, user: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATTNLAB_CACHE_DIR": str(cache), "CXX": "no-such-compiler-attnlab",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-c", CHILD]
    if user:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
        env["HOME"] = str(cache)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120,
                          cwd="/")


def _nobody_runs_python() -> bool:
    """Whether `nobody` can run this interpreter with torch: not when the checkout or the virtual
    environment lies below a folder only its owner may enter (e.g. one made by mktemp -d)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
           sys.executable, "-c", "import torch"]
    return subprocess.run(cmd, env=env, capture_output=True, timeout=120, cwd="/").returncode == 0


def _copy_cache(tmp_path: Path) -> tuple[Path, Path]:
    src = _real_build()
    base = tmp_path / "cache"
    dst = base / "kernels" / src.name
    dst.parent.mkdir(parents=True, mode=0o700)
    os.chmod(base, 0o700)
    shutil.copytree(src, dst)
    (lib,) = dst.glob("*.so")
    return base, lib


@pytest.mark.slow
def test_a_truncated_real_library_is_no_sigbus(tmp_path):
    """The real library cut in half, in a fresh process that cannot rebuild: it runs on the
    PyTorch path with one warning instead of dying in dlopen."""
    base, lib = _copy_cache(tmp_path)
    data = lib.read_bytes()
    lib.write_bytes(data[: len(data) // 2])
    r = _child(base)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "available False" in r.stdout and "finite True" in r.stdout
    assert r.stderr.count("RuntimeWarning") == 1 and "truncated or modified" in r.stderr


@pytest.mark.slow
@pytest.mark.skipif(not ROOT or shutil.which("setpriv") is None,
                    reason="running as another uid needs root and setpriv")
def test_another_users_library_is_refused(tmp_path):
    """A whole, correctly hashed library planted by another user (root here) in the cache
    `nobody` uses: nobody's process does not load it."""
    import tempfile

    if not _nobody_runs_python():
        pytest.skip("nobody cannot run this interpreter with torch (a private checkout)")
    shared = Path(tempfile.mkdtemp(prefix="attnlab-shared-"))  # /tmp: nobody reaches it
    try:
        base, _ = _copy_cache(shared)
        for p in (shared, base, *base.rglob("*")):
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        r = _child(base, user=str(NOBODY))
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "available False" in r.stdout and "finite True" in r.stdout
    assert r.stderr.count("RuntimeWarning") == 1 and "not by this user" in r.stderr
