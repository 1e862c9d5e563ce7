"""Building the interval kernel: the switch, the status, the once-only warning when it cannot be
built, and a build that two builders at once see whole (lock + rename)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from attnlab.ops import kernels
from attnlab.ops.kernels import build, isa


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process state with nothing loaded or failed, and an empty cache."""
    monkeypatch.setattr(build, "_LOADED", {})
    monkeypatch.setattr(build, "_FAILED", {})
    monkeypatch.setattr(build, "_WARNED", set())
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_switched_off(monkeypatch):
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")
    assert not kernels.available()
    st = kernels.status()
    assert not st.built and st.isa is None and "ATTNLAB_KERNEL=0" in st.reason


def test_no_compiler_warns_once_and_reports_why(fresh, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-attnlab")
    monkeypatch.setenv("ATTNLAB_KERNEL_ISA", "scalar")
    with pytest.warns(RuntimeWarning, match=r"no C\+\+ compiler"):
        assert not kernels.available()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not kernels.available()  # the second time: no warning
    st = kernels.status()
    assert not st.built and st.isa == "scalar" and "no C++ compiler" in st.reason
    with pytest.raises(RuntimeError, match="not available"):
        kernels.interval_forward(*_tiny(), scale=1.0)


def test_an_isa_the_cpu_lacks_is_never_run(fresh, monkeypatch):
    monkeypatch.setattr(isa, "cpu_flags", lambda: {"sse2"})
    monkeypatch.setenv("ATTNLAB_KERNEL_ISA", "avx2")
    with pytest.warns(RuntimeWarning, match="cannot run the avx2 build"):
        assert not kernels.available()
    assert kernels.runnable() == ("scalar",)


def test_unknown_isa_is_refused(monkeypatch):
    monkeypatch.setenv("ATTNLAB_KERNEL_ISA", "sse9")
    from attnlab import AttnlabError

    with pytest.raises(AttnlabError, match="ATTNLAB_KERNEL_ISA"):
        build.chosen_isa()


def test_two_builders_at_once_build_once_and_atomically(fresh, monkeypatch):
    """Both builders return a complete library; the compile ran once; no temp folder is left."""
    calls = []

    def fake_compile(isa, name, ns, build_dir):
        calls.append(build_dir)
        time.sleep(0.3)  # long enough for the other builder to arrive and wait on the lock
        (build_dir / f"{name}.so").write_bytes(b"whole")

    monkeypatch.setattr(build, "_compile", fake_compile)
    name, ns = build._names("scalar")
    final = build.cache_root() / build.build_key("scalar")
    errors = []

    def builder():
        try:
            build._build("scalar", name, ns, final)
            assert (final / f"{name}.so").read_bytes() == b"whole"
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=builder) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(calls) == 1
    assert [p.name for p in final.parent.iterdir() if p.suffix == ".tmp"] == []


def test_failed_build_leaves_no_partial_folder(fresh, monkeypatch):
    def broken(isa, name, ns, build_dir):
        (build_dir / "half.o").write_bytes(b"")
        raise RuntimeError("error: the compiler stopped")

    monkeypatch.setattr(build, "_compile", broken)
    monkeypatch.setenv("ATTNLAB_KERNEL_ISA", "scalar")
    with pytest.warns(RuntimeWarning, match="the compiler stopped"):
        assert not kernels.available()
    assert sorted(os.listdir(build.cache_root())) == [f"{build.build_key('scalar')}.lock"]


def test_status_names_the_build():
    st = kernels.status(build=True)
    if not st.built:
        pytest.skip(f"kernel not buildable here: {st.reason}")
    assert st.isa == build.chosen_isa() and st.isa in st.runnable
    assert st.cache and st.cache.endswith(build.build_key(st.isa))


def _tiny():
    import torch

    q = torch.randn(1, 1, 2, 4)
    lo, hi = torch.zeros(1, 1, 2, dtype=torch.int32), torch.ones(1, 1, 2, dtype=torch.int32)
    return q, q, q, lo, hi


def test_ops_listed_are_the_ops_registered():
    """build.OPS (each looked up once at load) names exactly the ops csrc/ops.cpp registers."""
    import torch

    if not kernels.available():
        pytest.skip("the kernel is not available here")
    ns = build._names(build.chosen_isa())[1]
    got = {s.name.split("::")[1] for s in torch._C._jit_get_all_schemas()
           if s.name.startswith(ns + "::")}
    assert got == set(build.OPS)
