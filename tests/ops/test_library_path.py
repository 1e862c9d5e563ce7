"""build.library_path names a file that exists, also after the cache folder the process loaded
the library from is gone (a test's temporary ATTNLAB_CACHE_DIR): the wheel's staging copies it."""

from __future__ import annotations

import pytest

from attnlab.ops.kernels import build


def test_library_path_exists_after_its_cache_folder_is_removed(monkeypatch):
    isa = build.runnable()[-1]  # scalar: every CPU runs it
    try:
        build.load(isa)
    except build.KernelUnavailable as e:
        pytest.skip(f"no {isa} build here: {e}")
    real = build.library_path(isa)
    assert real.exists()
    monkeypatch.setitem(build._FROM, isa, str(real.parent.parent / "removed-since"))
    got = build.library_path(isa)
    assert got.exists() and got.name == real.name
