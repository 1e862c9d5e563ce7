"""Attention as matplotlib figures (PNG/SVG): one head, a layer's heads, the whole model.

Rows are query tokens (the one borrowing), columns are key tokens (borrowed from); colour is the
softmax weight on a fixed 0..1 scale so heads compare honestly. Cells the mask forbids are grey and
hatched, so "weight 0 because masked" never looks like "weight 0 because ignored". Each layer is
drawn with its own mask (a model mixing sliding-window and full layers).

Caution: labels stay legible up to about 64 tokens; beyond that the single-head figure keeps
growing (capped at 30 inches) and the grids label every k-th token only.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from attnlab.capture import ModelAttention, check_capture
from attnlab.errors import AttnlabError
from attnlab.viz.checks import check_index

MASKED = "#d4d4d4"
HATCH = "#8f8f8f"
FORMATS = (".png", ".svg")


def _mpl():
    try:
        import matplotlib
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch, Rectangle
    except ImportError:  # pragma: no cover - the viz extra brings it
        raise AttnlabError("plot: matplotlib is missing; install the viz extra: "
                           "pip install 'attnlab[viz]'") from None
    return matplotlib, Figure, Patch, Rectangle


def _label(tok: str, n: int = 14) -> str:
    tok = tok.replace("\n", "\\n").replace("\t", "\\t")
    return tok if len(tok) <= n else tok[: n - 1] + "…"


def _fontsize(cell_in: float) -> float:
    """A tick label that fits its row: ~75% of the cell height, 5.5..11 pt."""
    return float(np.clip(cell_in * 72 * 0.75, 5.5, 11))


def _draw(ax, weights, allowed, tokens=None, fontsize=8.0, every=1, hatch=True):
    """One heatmap on `ax`; returns the image (for a colorbar)."""
    mpl, _, _, Rectangle = _mpl()
    L, S = weights.shape
    cmap = mpl.colormaps["Blues"].with_extremes(bad=(0, 0, 0, 0))
    data = np.ma.masked_array(weights, mask=~allowed)
    # masked cells are transparent: the hatched grey patch underneath shows through
    ax.add_patch(Rectangle((-0.5, -0.5), S, L, facecolor=MASKED, edgecolor=HATCH,
                           hatch="///" if hatch else None, linewidth=0, zorder=0))
    im = ax.imshow(data, cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest", zorder=1,
                   aspect="equal")
    if tokens is None:
        ax.set_xticks([])
        ax.set_yticks([])
    else:
        ticks = np.arange(0, S, every)
        ax.set_xticks(ticks, [_label(tokens[i]) for i in ticks], rotation=90, fontsize=fontsize)
        ax.set_yticks(np.arange(0, L, every),
                      [_label(tokens[i]) for i in range(0, L, every)], fontsize=fontsize)
        ax.tick_params(length=2, pad=1)
    return im


def _layer_mask(ma: ModelAttention, layer: int) -> np.ndarray:
    """(L, S) bool: what `layer` allowed (its own mask when the capture has one per layer)."""
    masks = getattr(ma, "layer_masks", None)
    return np.asarray(ma.mask if masks is None else masks[layer], dtype=bool)


def _legend(fig, Patch, mask):
    if np.asarray(mask, dtype=bool).all():
        return  # nothing masked: no key for it
    fig.legend(handles=[Patch(facecolor=MASKED, edgecolor=HATCH, hatch="///",
                              label="masked (may not attend)")],
               loc="outside lower right", fontsize=8, frameon=False)


def figure_head(ma: ModelAttention, layer: int, head: int):
    """One head: an L x S heatmap with every token labelled."""
    n_layers, H, L, S = check_capture(ma)
    layer = check_index("layer", layer, n_layers, "layers")
    head = check_index("head", head, H, "heads")
    mpl, Figure, Patch, _ = _mpl()
    cell = float(np.clip(6.0 / max(L, S), 0.16, 0.4))
    fs = _fontsize(cell)
    margin = max(len(_label(t)) for t in ma.tokens) * fs * 0.62 / 72 + 0.4
    size = (min(S * cell + margin + 1.4, 30), min(L * cell + margin + 1.0, 30))
    with mpl.rc_context({"hatch.linewidth": 0.5}):
        fig = Figure(figsize=size, layout="constrained")
        ax = fig.add_subplot()
        im = _draw(ax, np.asarray(ma.weights[layer, head], dtype=float),
                   _layer_mask(ma, layer), ma.tokens, fs)
        ax.set_xlabel("key (borrowed from)", fontsize=9)
        ax.set_ylabel("query (borrows)", fontsize=9)
        ax.set_title(f"{ma.model_name}: layer {layer}, head {head}", fontsize=10)
        fig.colorbar(im, ax=ax, shrink=min(1.0, 4.0 / size[1] + 0.3), label="weight")
        _legend(fig, Patch, _layer_mask(ma, layer))
    return fig


def figure_layer(ma: ModelAttention, layer: int):
    """All heads of one layer as a grid; tokens labelled on the outer panels when they fit."""
    n_layers, H, L, S = check_capture(ma)
    layer = check_index("layer", layer, n_layers, "layers")
    mpl, Figure, Patch, _ = _mpl()
    cols = min(H, 4)
    rows = math.ceil(H / cols)
    panel = float(np.clip(max(L, S) * 0.11, 1.8, 4.5))
    every = max(1, math.ceil(max(L, S) / 32))  # at most ~32 labels per panel side
    fs = _fontsize(panel / math.ceil(max(L, S) / every))
    margin = max(len(_label(t)) for t in ma.tokens) * fs * 0.62 / 72 + 0.3
    with mpl.rc_context({"hatch.linewidth": 0.4}):
        fig = Figure(figsize=(cols * panel + margin + 1.2, rows * (panel + 0.3) + margin + 0.6),
                     layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False)
        im = None
        for h in range(rows * cols):
            ax = axes[h // cols, h % cols]
            if h >= H:
                ax.set_axis_off()
                continue
            im = _draw(ax, np.asarray(ma.weights[layer, h], dtype=float),
                       _layer_mask(ma, layer), ma.tokens, fs, every)
            if h % cols:
                ax.set_yticklabels([])
            if h + cols < H:
                ax.set_xticklabels([])
            ax.set_title(f"head {h}", fontsize=9)
        fig.suptitle(f"{ma.model_name}: layer {layer}, all {H} heads (rows: query, columns: key)",
                     fontsize=11)
        fig.colorbar(im, ax=axes, shrink=0.6, label="weight")
        _legend(fig, Patch, _layer_mask(ma, layer))
    return fig


def figure_model(ma: ModelAttention):
    """Every layer and head as unlabelled thumbnails: layers down, heads across.

    One mosaic image rather than layers x heads axes: 72 axes take seconds to lay out, one image
    takes milliseconds and looks the same.
    """
    n_layers, H, L, S = check_capture(ma)
    mpl, Figure, _Patch, _ = _mpl()
    gap = max(1, round(0.12 * max(L, S)))
    rgba = mpl.colormaps["Blues"](np.clip(np.asarray(ma.weights, dtype=float), 0, 1))
    for layer in range(n_layers):  # (layers, H, L, S, 4): grey where that layer masks
        rgba[layer][:, ~_layer_mask(ma, layer)] = mpl.colors.to_rgba(MASKED)
    mosaic = np.ones((n_layers * (L + gap) - gap, H * (S + gap) - gap, 4))  # white gaps
    for layer in range(n_layers):
        for h in range(H):
            r, c = layer * (L + gap), h * (S + gap)
            mosaic[r:r + L, c:c + S] = rgba[layer, h]
    thumb = 0.95
    fig = Figure(figsize=(H * thumb + 1.6, n_layers * thumb + 1.2), layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(mosaic, interpolation="nearest", aspect="equal")
    ax.set_xticks([h * (S + gap) + (S - 1) / 2 for h in range(H)], [f"H{h}" for h in range(H)],
                  fontsize=8)
    ax.set_yticks([i * (L + gap) + (L - 1) / 2 for i in range(n_layers)],
                  [f"L{i}" for i in range(n_layers)], fontsize=8)
    ax.tick_params(length=0)
    ax.xaxis.set_ticks_position("top")
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(f"{ma.model_name}: {n_layers} layers × {H} heads, {L} tokens "
                 f"(rows: layers, columns: heads; grey = masked)", fontsize=10)
    sm = mpl.cm.ScalarMappable(cmap="Blues", norm=mpl.colors.Normalize(0, 1))
    fig.colorbar(sm, ax=ax, shrink=0.6, label="weight")
    return fig


def plot(ma: ModelAttention, layer: int | None = None, head: int | None = None):
    """The figure the CLI draws: one head (layer and head), a layer's heads, or the whole model."""
    if head is not None and layer is None:
        raise AttnlabError(f"head: needs a layer too (got head={head}, layer=None)")
    if layer is None:
        return figure_model(ma)
    if head is None:
        return figure_layer(ma, layer)
    return figure_head(ma, layer, head)


def save_plot(ma: ModelAttention, path, layer: int | None = None, head: int | None = None,
              dpi: int = 150) -> Path:
    """Draw (see `plot`) and save as PNG or SVG, chosen by the file's suffix; returns the path."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise AttnlabError(f"output: expected a file ending in .png or .svg, got {str(path)!r}")
    fig = plot(ma, layer, head)
    fig.savefig(path, dpi=dpi, metadata={"Date": None} if path.suffix.lower() == ".svg" else None)
    return path
