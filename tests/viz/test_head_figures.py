"""A run's heads.jsonl over training: the statistic per head next to its loss curves (training,
validation, and the probe's two copies where the run recorded them)."""

from __future__ import annotations

import json

import matplotlib  # noqa: F401  (the viz extra: missing, these tests fail, never skip)

from attnlab.viz.head_figures import FIRST, SECOND, TRAIN, VAL, draw_run, loss_curves

GRID = {"induction": [[0.02, 0.03]]}


def _line(step, loss, val, **new):
    return {"step": step, "loss": loss, "val_loss": val, "stats": GRID,
            "labels": [["-", "-"]], **new}


# as track_heads wrote them before val_step and the copy losses: validation every 50 steps,
# a line every 25, each repeating the last validation until the next
OLD = [_line(0, None, None), _line(25, 3.0, None), _line(50, 2.8, 2.9), _line(75, 2.7, 2.9),
       _line(100, 2.6, 2.85)]
NEW = [_line(0, None, None, val_step=None, first_copy_loss=4.3, second_copy_loss=4.3),
       _line(25, 3.0, None, val_step=None, first_copy_loss=5.0, second_copy_loss=5.1),
       _line(50, 2.8, 2.9, val_step=50, first_copy_loss=6.0, second_copy_loss=5.0),
       _line(75, 2.7, 2.9, val_step=50, first_copy_loss=6.2, second_copy_loss=4.0),
       _line(100, 2.6, 2.9, val_step=100, first_copy_loss=6.4, second_copy_loss=3.0)]


def _write(tmp_path, lines):
    run = tmp_path / "run"
    run.mkdir()
    (run / "heads.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    return run


def _legend(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[1].get_legend().get_texts()]


def test_loss_curves_of_a_run_with_the_probe_copies():
    curves = loss_curves(NEW)
    assert list(curves) == [TRAIN, VAL, FIRST, SECOND]
    assert curves[TRAIN] == ([25, 50, 75, 100], [3.0, 2.8, 2.7, 2.6])
    # each validation once, at the step it was taken (also one that equals the one before)
    assert curves[VAL] == ([50, 100], [2.9, 2.9])
    assert curves[FIRST] == ([0, 25, 50, 75, 100], [4.3, 5.0, 6.0, 6.2, 6.4])
    assert curves[SECOND] == ([0, 25, 50, 75, 100], [4.3, 5.1, 5.0, 4.0, 3.0])


def test_loss_curves_of_an_older_run():
    curves = loss_curves(OLD)
    assert list(curves) == [TRAIN, VAL]
    assert curves[VAL] == ([50, 100], [2.9, 2.85])  # the repeat at step 75 is left out
    assert list(loss_curves([_line(0, None, None), _line(5, 2.5, None)])) == [TRAIN]


def test_draw_run_draws_the_losses_with_a_legend(tmp_path):
    fig = draw_run(_write(tmp_path, NEW), "induction", tmp_path / "new.png")
    assert (tmp_path / "new.png").read_bytes()[:4] == b"\x89PNG"
    assert _legend(fig) == [TRAIN, VAL, FIRST, SECOND]
    second = next(line for line in fig.axes[1].get_lines() if line.get_label() == SECOND)
    assert list(second.get_ydata()) == [4.3, 5.1, 5.0, 4.0, 3.0]


def test_draw_run_still_draws_an_older_run(tmp_path):
    fig = draw_run(_write(tmp_path, OLD), "induction", tmp_path / "old.svg")
    assert (tmp_path / "old.svg").read_text().lstrip().startswith("<?xml")
    assert _legend(fig) == [TRAIN, VAL]
