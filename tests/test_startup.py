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
             "print(sorted(m for m in ('torch', 'numpy', 'attnlab.capture', 'attnlab.tracing') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return eval(out.stdout.strip().splitlines()[-1])


def test_help_imports_no_torch():
    assert _loaded("from attnlab.cli import build_parser; build_parser().format_help()") == []
    assert _loaded("import attnlab") == []


def test_records_import_no_drawing():
    """Data flows one way: the records (capture, tracing) and explain load no viz module; viz
    registers how Jupyter shows the records."""
    code = ("import sys, attnlab.capture, attnlab.tracing, attnlab.explain\n"
            "print([m for m in sys.modules if m.startswith('attnlab.viz')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_lazy_names_resolve():
    from attnlab import Trace, attention, masks, nn, trace

    assert callable(attention) and callable(trace) and isinstance(Trace, type)
    assert masks.causal and nn.CausalSelfAttention
    assert set(attnlab.__all__) <= set(dir(attnlab))
    assert all(getattr(attnlab, name) is not None for name in attnlab.__all__)
    importlib.import_module("attnlab.tracing")  # the module has its own name: no swap needed
    assert attnlab.trace is trace and sys.modules["attnlab.tracing"].trace is trace


def test_submodules_as_attributes_after_a_bare_import():
    assert "torch" in _loaded("import attnlab\nattnlab.ops.attention, attnlab.reference.steps")


def test_section_names_match_the_lesson():
    from attnlab.cli.lesson import SECTION_NAMES
    from attnlab.explain.lesson_sections import SECTIONS

    assert ", ".join(SECTIONS) == SECTION_NAMES


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        attnlab.no_such_name  # noqa: B018
    for module in map(importlib.import_module, ("attnlab.explain", "attnlab.viz")):
        with pytest.raises(AttributeError):
            module.no_such_name  # noqa: B018
        assert set(module.__all__) <= set(dir(module))
