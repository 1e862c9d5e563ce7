"""Head statistics and rollout as matplotlib figures (PNG/SVG): a layers × heads heatmap of one
statistic with each head's label, where one token's information came from (rollout and flow), and
a statistic's per-head curve over training next to the loss."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from attnlab.errors import AttnlabError
from attnlab.explain.training import read_heads
from attnlab.viz.figures import FORMATS, _label, _mpl

#: statistics on a 0..1 scale; the rest (entropy in nats, offset in tokens) get their own range
_UNIT = {"entropy_norm", "self", "prev", "next", "first", "special", "punct", "max",
         "offset_share", "duplicate", "induction"}
_ABBREV = {"previous-token": "prev", "next-token": "next", "sink / [CLS]": "sink",
           "punctuation": "punct", "induction": "ind", "broad": "broad", "self": "self",
           "[SEP]": "SEP", "-": ""}


def figure_stat(stats, name: str):
    """Layers (rows) × heads (columns) coloured by statistic `name`, each cell with its value and
    a short label."""
    _, Figure, _, _ = _mpl()
    values = np.asarray(stats[name], dtype=float)
    n_layers, H = values.shape
    fig = Figure(figsize=(max(4.0, 0.75 * H + 1.5), max(2.5, 0.6 * n_layers + 1.2)))
    ax = fig.add_subplot()
    vmin, vmax = (0.0, 1.0) if name in _UNIT else (np.nanmin(values), np.nanmax(values))
    if not (math.isfinite(vmin) and math.isfinite(vmax)) or vmin == vmax:
        vmin, vmax = 0.0, 1.0
    im = ax.imshow(np.ma.masked_invalid(values), cmap="viridis", vmin=vmin, vmax=vmax,
                   aspect="auto")
    for l in range(n_layers):
        for h in range(H):
            v = values[l, h]
            text = "-" if math.isnan(v) else f"{int(v):+d}" if name == "offset" else f"{v:.2f}"
            short = _ABBREV.get(stats.labels[l][h], stats.labels[l][h])
            dark = not math.isnan(v) and (v - vmin) / (vmax - vmin) < 0.6
            ax.text(h, l, f"{text}\n{short}" if short else text, ha="center", va="center",
                    fontsize=6.5, color="white" if dark else "black")
    ax.set_xticks(range(H), [str(h) for h in range(H)])
    ax.set_yticks(range(n_layers), [str(l) for l in range(n_layers)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"{stats.model}: {name} per head", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    return fig


def figure_sources(tokens, focus: int, rows: dict):
    """Bars: for token `focus`, the share of its top-layer representation from each input token,
    one series per method in `rows` ({"rollout": (L,), "flow": (L,)})."""
    _, Figure, _, _ = _mpl()
    L = len(tokens)
    fig = Figure(figsize=(max(5.0, 0.45 * L + 1.5), 3.2))
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(rows))
    for k, (method, row) in enumerate(rows.items()):
        ax.bar(np.arange(L) + (k - (len(rows) - 1) / 2) * width, row, width, label=method)
    ax.set_xticks(range(L), [_label(t) for t in tokens], rotation=60, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share")
    ax.set_title(f'Where "{tokens[focus]}" (token {focus}) came from, through every layer',
                 fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


#: the loss panel's curves, as `loss_curves` labels them
TRAIN, VAL = "training (all windows)", "validation (plain text)"
FIRST, SECOND = "probe, first copy", "probe, second copy"
_LOSS_STYLE = {TRAIN: {"color": "black"}, VAL: {"color": "tab:gray", "linestyle": "--"},
               FIRST: {"color": "tab:orange"}, SECOND: {"color": "tab:blue"}}


def figure_curves(steps, values, losses: dict, name: str, title: str):
    """Left: statistic `name` per head over training steps (values (T, layers, heads)); right:
    each loss curve of `losses` ({label: (steps, values)}, as `loss_curves` gives), with a legend
    when there is more than one."""
    _, Figure, _, _ = _mpl()
    values = np.asarray(values, dtype=float)
    fig = Figure(figsize=(10, 4.0 if len(losses) > 1 else 3.6))
    ax, bx = fig.subplots(1, 2)
    for l in range(values.shape[1]):
        for h in range(values.shape[2]):
            ax.plot(steps, values[:, l, h], label=f"L{l} H{h}", linewidth=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel(name)
    ax.set_title(f"{name} per head", fontsize=10)
    if values.shape[1] * values.shape[2] <= 16:
        ax.legend(fontsize=6, ncol=2)
    for label, (xs, ys) in losses.items():
        style = _LOSS_STYLE.get(label, {})
        bx.plot(xs, ys, label=label, linewidth=1, **style)
    bx.set_xlabel("step")
    bx.set_ylabel("loss (nats)")
    bx.set_title("loss", fontsize=10)
    if len(losses) > 1:  # under the panel: the curves fill every corner of it
        bx.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.18),
                  frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def loss_curves(lines: list[dict]) -> dict:
    """The loss curves of heads.jsonl `lines`: {label: (steps, values)} for the training loss, the
    validation loss (each validation once, at the step it was taken), and the loss on the probe's
    first and second copy; a curve no line carries is left out (older files have only the
    training and validation losses)."""
    curves = {TRAIN: [(d["step"], d["loss"]) for d in lines if d.get("loss") is not None]}
    val: list[tuple] = []
    for d in lines:
        v, at = d.get("val_loss"), d.get("val_step")
        if v is None:
            continue
        if val and val[-1][1] == v and at in (None, val[-1][0]):
            continue  # a line repeats the last validation until the next one: keep it once
        val.append((d["step"] if at is None else at, v))
    curves[VAL] = val
    for label, field in ((FIRST, "first_copy_loss"), (SECOND, "second_copy_loss")):
        curves[label] = [(d["step"], d[field]) for d in lines if d.get(field) is not None]
    return {label: ([x for x, _ in pts], [y for _, y in pts]) for label, pts in curves.items()
            if pts}


def save_figure(fig, path) -> Path:
    """Write `fig` as PNG or SVG (by the suffix)."""
    out = Path(path)
    if out.suffix.lower() not in FORMATS:
        raise AttnlabError(f"path: expected a file ending in .png or .svg, got {str(path)!r}")
    fig.savefig(out, dpi=130)
    return out


def draw_run(run_dir, stat: str, output):
    """A run's heads.jsonl (`track_heads`) as `figure_curves` with `loss_curves`, written to
    `output`; returns the figure."""
    lines = read_heads(run_dir)
    steps = [d["step"] for d in lines]
    values = np.array([[[np.nan if v is None else v for v in row] for row in d["stats"][stat]]
                       for d in lines], dtype=float)  # (T, layers, heads)
    fig = figure_curves(steps, values, loss_curves(lines), stat,
                        f"{stat} on a repeated-random probe while training ({run_dir})")
    save_figure(fig, output)
    return fig
