"""Jupyter HTML: Trace and ModelAttention render, and tokens stay text."""

from __future__ import annotations

import html
import re

from attnlab import trace
from attnlab.masks import causal
from viz.fakes import XSS, fake_capture


def test_trace_repr_html_table_with_escaped_tokens():
    t = trace([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]],
              [[1.0], [2.0], [3.0]], mask=causal(), tokens=["a", XSS, "c"])
    doc = t._repr_html_()
    assert "<img" not in doc and html.escape(XSS) in doc
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", doc)
    assert len(cells) == 9 and cells.count("·") == 3  # upper triangle masked
    first = [float(c[:-1]) for c in cells[:3] if c.endswith("%")]
    assert first == [100.0]
    row3 = [float(c[:-1]) / 100 for c in cells[6:9]]
    assert abs(sum(row3) - 1) < 2e-3 and abs(row3[0] - t.weights[2, 0]) < 1e-3


def test_batched_trace_shows_first_heads():
    import numpy as np

    rng = np.random.default_rng(0)
    t = trace(rng.normal(size=(6, 2, 3)), rng.normal(size=(6, 2, 3)), rng.normal(size=(6, 2, 3)))
    doc = t._repr_html_()
    assert doc.count("<table") == 4 and "2 more heads not shown" in doc


def test_model_attention_repr_html_is_a_sandboxed_page():
    ma = fake_capture(["x", XSS])
    doc = ma._repr_html_()
    assert doc.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts allow-downloads"' in doc
    assert "<img" not in doc and "<script" not in doc  # all of it inside the escaped srcdoc
    inner = html.unescape(re.search(r'srcdoc="([^"]*)"', doc).group(1))
    assert inner.startswith("<!DOCTYPE html>") and 'id="attn-data"' in inner
