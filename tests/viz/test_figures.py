"""Figures: the three kinds, file formats, masked cells distinct, labels legible, sizes grow."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from attnlab.errors import AttnlabError
from attnlab.viz.figures import figure_head, figure_layer, figure_model, save_plot
from viz.fakes import fake_capture


def _words(n):
    return [f"w{i}" for i in range(n)]


@pytest.mark.parametrize("layer, head, suffix", [(0, 1, ".png"), (1, None, ".svg"),
                                                 (None, None, ".png")])
def test_save_plot_formats(tmp_path, layer, head, suffix):
    ma = fake_capture(_words(6), n_layers=2, n_heads=3)
    out = save_plot(ma, tmp_path / f"f{suffix}", layer, head)
    data = out.read_bytes()
    if suffix == ".png":
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000
    else:
        root = ET.fromstring(data)
        assert root.tag.endswith("svg")


def test_plot_arguments_checked(tmp_path):
    ma = fake_capture(_words(4), n_layers=2, n_heads=3)
    with pytest.raises(AttnlabError, match=r"output: expected a file ending in \.png or \.svg"):
        save_plot(ma, tmp_path / "x.jpg")
    with pytest.raises(AttnlabError, match="head: needs a layer"):
        save_plot(ma, tmp_path / "x.png", head=1)
    with pytest.raises(AttnlabError, match=r"layer: expected 0\.\.1 \(there are 2 layers\), got 2"):
        save_plot(ma, tmp_path / "x.png", layer=2)
    with pytest.raises(AttnlabError, match=r"head: expected 0\.\.2"):
        save_plot(ma, tmp_path / "x.png", layer=-1, head=3)


def _pixels(fig):
    fig.canvas.draw()  # Figure() gets an Agg canvas on first savefig/draw via FigureCanvasBase
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(float)


def _cell_mean(fig, ax, img, i, j):
    """Mean RGB over the inner half of cell (row i, column j), in image pixel coordinates."""
    h = img.shape[0]
    (x0, y0), (x1, y1) = ax.transData.transform([(j - 0.25, i + 0.25), (j + 0.25, i - 0.25)])
    return img[int(h - y1):int(h - y0), int(x0):int(x1)].reshape(-1, 3).mean(0)


def test_masked_cells_look_different_from_zero_weight():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    ma = fake_capture(_words(5), n_layers=1, n_heads=1)
    ma.weights[0, 0] = np.eye(5)  # cell (3, 1) allowed with weight 0; (1, 3) masked
    fig = figure_head(ma, 0, 0)
    FigureCanvasAgg(fig)
    img = _pixels(fig)
    ax = fig.axes[0]
    zero, masked, full = (_cell_mean(fig, ax, img, *c) for c in ((3, 1), (1, 3), (2, 2)))
    assert zero.min() > 235, zero             # weight 0: near white
    assert masked.mean() < zero.mean() - 25   # masked: visibly grey
    assert np.ptp(masked) < 12, masked        # ... and neutral, not a shade of the colormap
    assert full[2] > full[0] + 60             # weight 1: dark blue


def test_labels_legible_at_64_tokens():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = figure_head(fake_capture(_words(64), n_layers=1, n_heads=1), 0, 0)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    r = canvas.get_renderer()
    ax = fig.axes[0]
    labels = ax.get_yticklabels()
    assert len(labels) == 64 and all(t.get_text() for t in labels)
    assert min(t.get_fontsize() for t in labels) >= 5.5
    boxes = sorted((t.get_window_extent(r) for t in labels), key=lambda b: b.y0)
    assert all(a.y1 <= b.y0 + 0.5 for a, b in itertools.pairwise(boxes))  # no overlap
    xboxes = sorted((t.get_window_extent(r) for t in ax.get_xticklabels()), key=lambda b: b.x0)
    assert all(a.x1 <= b.x0 + 0.5 for a, b in itertools.pairwise(xboxes))


def test_sizes_scale_with_tokens():
    small, big = fake_capture(_words(8), 1, 4), fake_capture(_words(48), 1, 4)
    for draw in (lambda ma: figure_head(ma, 0, 0), lambda ma: figure_layer(ma, 0)):
        w_small, h_small = draw(small).get_size_inches()
        w_big, h_big = draw(big).get_size_inches()
        assert w_big > 1.5 * w_small and h_big > 1.5 * h_small
    assert figure_model(small).axes  # one mosaic, plus its colorbar


def test_each_layer_is_drawn_with_its_own_mask():
    """Gemma 2: layer 0 a 4-token sliding window, layer 1 every earlier token. The window's
    outside is grey in layer 0's figures (not "weight 0"), and only there."""
    from viz.fakes import recorded_capture

    ma = recorded_capture("gemma2")
    window = ma.layer_mask(0)
    assert not (window == ma.layer_mask(1)).all()
    for layer in (0, 1):
        want = ~ma.layer_mask(layer)  # masked cells
        for fig in (figure_head(ma, layer, 2), figure_layer(ma, layer)):
            assert (np.ma.getmaskarray(fig.axes[0].images[0].get_array()) == want).all()
    grey = np.array([0xD4, 0xD4, 0xD4]) / 255
    mosaic = figure_model(ma).axes[0].images[0].get_array()  # layers down, heads across
    L = len(ma.tokens)
    gap = mosaic.shape[0] - 2 * L  # two layers and one gap between them
    for layer in (0, 1):
        cell = mosaic[layer * (L + gap):layer * (L + gap) + L, :L, :3]  # head 0
        assert (np.isclose(cell, grey, atol=1e-6).all(-1) == ~ma.layer_mask(layer)).all()
