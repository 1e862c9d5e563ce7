"""Terminal drawing: fits 80 columns, degrades with a notice, readable without colour."""

from __future__ import annotations

import numpy as np

from attnlab.viz.terminal import SHADES, bars, heatmap, shade, to_text
from viz.fakes import fake_capture


def _lines(text):
    return text.rstrip("\n").splitlines()


def test_bars_in_order_with_percentages():
    w = np.array([0.1, 0.6, 0.3])
    out = to_text(bars(w, ["cat", "mat", "because"]))
    rows = [ln for ln in _lines(out) if "%" in ln]
    assert [r.split()[0] for r in rows] == ["cat", "mat", "because"]
    assert [r.split()[-1] for r in rows] == ["10.0%", "60.0%", "30.0%"]
    assert rows[1].count("█") > rows[2].count("█") > rows[0].count("█")


def test_bars_top_k_notice_and_masked_note():
    w = np.array([0.05, 0.4, 0.05, 0.3, 0.2, 0.0])
    allowed = np.array([1, 1, 1, 1, 1, 0], dtype=bool)
    out = to_text(bars(w, list("abcdef"), allowed=allowed, top_k=3))
    rows = [ln.split()[0] for ln in _lines(out) if ln.rstrip().endswith("%")]
    assert rows == ["b", "d", "e"]
    assert "2 more tokens not shown (top 3 of 5; together 10.0%)" in out
    assert "1 masked tokens not shown" in out


def test_heatmap_cells_and_mask_at_small_size():
    ma = fake_capture(["The", "cat", "sat", "on"], n_layers=1, n_heads=1)
    w = ma.weights[0, 0]
    out = to_text(heatmap(w, ma.tokens, ma.tokens, mask=ma.mask))
    rows = [ln for ln in _lines(out) if ln[:12].strip() in ma.tokens]
    assert len(rows) == 4
    for i, row in enumerate(rows):
        cells = [row[13 + 2 * j: 15 + 2 * j] for j in range(4)]
        for j, cell in enumerate(cells):
            if ma.mask[i, j]:
                assert cell == shade(w[i, j]) * 2
            else:
                assert cell.strip() == "·"
    assert "showing the first" not in out


def test_heatmap_long_input_fits_80_columns_with_notice():
    toks = [f"token{i}" for i in range(70)]
    ma = fake_capture(toks, n_layers=1, n_heads=1)
    out = to_text(heatmap(ma.weights[0, 0], toks, toks, mask=ma.mask))
    assert max(len(ln) for ln in _lines(out)) <= 80
    assert "showing the first 40 of 70 query tokens and 33 of 70 key tokens" in out


def test_colour_only_when_asked():
    w = np.array([[1.0, 0.0], [0.5, 0.5]])
    plain = to_text(heatmap(w, ["a", "b"], ["a", "b"]))
    ansi = to_text(heatmap(w, ["a", "b"], ["a", "b"]), color=True)
    assert "\x1b[" not in plain and "\x1b[" in ansi
    assert SHADES[-1] * 2 in plain
