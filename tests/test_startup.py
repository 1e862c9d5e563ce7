"""Start-up: `import attnlab` and `attnlab --help` load no torch; the lazy names still resolve."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import attnlab


def _loaded(code: str) -> list[str]:
    """The heavy modules loaded after running `code` in a fresh interpreter."""
    probe = (f"{code}\nimport sys\n"
             "print(sorted(m for m in ('torch', 'numpy', 'attnlab.capture', 'attnlab.trace') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return eval(out.stdout.strip().splitlines()[-1])


def test_help_imports_no_torch():
    assert _loaded("from attnlab.cli import build_parser; build_parser().format_help()") == []
    assert _loaded("import attnlab") == []


def test_viz_imports_no_capture():
    """The Jupyter hooks import viz when called; viz loads neither capture nor trace back."""
    assert "attnlab.capture" not in _loaded("import attnlab.viz.notebook, attnlab.viz.page")
    assert "attnlab.trace" not in _loaded("import attnlab.viz.notebook, attnlab.viz.page")


def test_lazy_names_resolve():
    from attnlab import Trace, attention, masks, nn, trace

    assert callable(attention) and callable(trace) and isinstance(Trace, type)
    assert masks.causal and nn.CausalSelfAttention
    assert set(attnlab.__all__) <= set(dir(attnlab))
    assert all(getattr(attnlab, name) is not None for name in attnlab.__all__)
    importlib.import_module("attnlab.trace")  # importing the submodule keeps the function
    assert attnlab.trace is trace and sys.modules["attnlab.trace"].trace is trace


def test_submodules_as_attributes_after_a_bare_import():
    assert "torch" in _loaded("import attnlab\nattnlab.ops.attention, attnlab.reference.steps")


def test_section_names_match_the_lesson():
    from attnlab.explain.lesson import SECTIONS
    from attnlab.explain.section_names import SECTIONS as NAMES

    assert tuple(SECTIONS) == NAMES


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        attnlab.no_such_name  # noqa: B018
    for module in map(importlib.import_module, ("attnlab.explain", "attnlab.viz")):
        with pytest.raises(AttributeError):
            module.no_such_name  # noqa: B018
        assert set(module.__all__) <= set(dir(module))
