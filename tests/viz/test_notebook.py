"""Jupyter HTML: Trace and ModelAttention render through the display viz registers in IPython's
formatter, and tokens stay text."""

from __future__ import annotations

import html
import re

import pytest
from IPython.core.formatters import HTMLFormatter

from attnlab import trace
from attnlab.masks import causal
from attnlab.viz.notebook import register
from viz.fakes import XSS, fake_capture


@pytest.fixture(scope="module")
def shown():
    """What Jupyter shows for a record: its HTML through IPython's formatter."""
    formatter = HTMLFormatter()
    assert register(formatter)
    return formatter


def test_trace_repr_html_table_with_escaped_tokens(shown):
    t = trace([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]],
              [[1.0], [2.0], [3.0]], mask=causal(), tokens=["a", XSS, "c"])
    doc = shown(t)
    assert "<img" not in doc and html.escape(XSS) in doc
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", doc)
    assert len(cells) == 9 and cells.count("·") == 3  # upper triangle masked
    first = [float(c[:-1]) for c in cells[:3] if c.endswith("%")]
    assert first == [100.0]
    row3 = [float(c[:-1]) / 100 for c in cells[6:9]]
    assert abs(sum(row3) - 1) < 2e-3 and abs(row3[0] - t.weights[2, 0]) < 1e-3


def test_batched_trace_shows_first_heads(shown):
    import numpy as np

    rng = np.random.default_rng(0)
    t = trace(rng.normal(size=(6, 2, 3)), rng.normal(size=(6, 2, 3)), rng.normal(size=(6, 2, 3)))
    doc = shown(t)
    assert doc.count("<table") == 4 and "2 more heads not shown" in doc


def test_model_attention_repr_html_is_a_sandboxed_page(shown):
    ma = fake_capture(["x", XSS])
    doc = shown(ma)
    assert doc.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts allow-downloads"' in doc
    assert "<img" not in doc and "<script" not in doc  # all of it inside the escaped srcdoc
    inner = html.unescape(re.search(r'srcdoc="([^"]*)"', doc).group(1))
    assert inner.startswith("<!DOCTYPE html>") and 'id="attn-data"' in inner


def test_records_have_no_html_of_their_own_and_outside_ipython_nothing_registers():
    t = trace([[1.0]], [[1.0]], [[1.0]])
    assert not hasattr(t, "_repr_html_") and not hasattr(fake_capture(["x"]), "_repr_html_")
    assert register() is False  # no running IPython shell here


def test_importing_attnlab_inside_ipython_registers_the_display():
    import subprocess
    import sys

    code = ("from IPython.core.interactiveshell import InteractiveShell\n"
            "shell = InteractiveShell.instance()\n"
            "import attnlab\n"
            "t = attnlab.trace([[1.0]], [[1.0]], [[1.0]])\n"
            "print('<table' in shell.display_formatter.formatters['text/html'](t))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "True"
