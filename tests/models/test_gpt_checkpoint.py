"""Checkpoints: round-trip, atomic files, is_checkpoint, refusing incomplete ones; tokenizer and
corpus."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab import AttnlabError
from attnlab.models import (
    GPT,
    CharTokenizer,
    GPTConfig,
    corpus_license,
    is_checkpoint,
    load_checkpoint,
    load_corpus,
    save_checkpoint,
)
from attnlab.models.checkpoint import atomic_write, read_checkpoint


def tiny_model(rotary=False, kv=2):
    torch.manual_seed(0)
    tok = CharTokenizer.from_text("abcdefgh \n")
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=2, n_head=2, n_kv_head=kv,
                    n_embd=16, rotary=rotary)
    return GPT(cfg), tok


@pytest.mark.parametrize("rotary", [False, True])
def test_round_trip_gives_the_same_model_and_tokenizer(tmp_path, rotary):
    model, tok = tiny_model(rotary)
    save_checkpoint(tmp_path / "ck", model, tok, state={"step": 7, "history": []})
    assert is_checkpoint(tmp_path / "ck")
    loaded, tok2 = load_checkpoint(tmp_path / "ck")
    assert not loaded.training and loaded.config == model.config
    assert tok2.chars == tok.chars and loaded.tokenizer is tok2
    ids = torch.tensor([tok.encode("abc hed\nfg")])
    model.eval()
    assert torch.equal(loaded(ids)[0], model(ids)[0])
    doc = json.loads((tmp_path / "ck" / "attnlab.json").read_text())
    assert doc["tokenizer"] == {"kind": "char", "chars": tok.chars} and doc["state"]["step"] == 7


def test_writes_leave_no_temporary_files(tmp_path):
    model, tok = tiny_model()
    save_checkpoint(tmp_path, model, tok)
    save_checkpoint(tmp_path, model, tok)  # overwriting is atomic too
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 and names[0] == "attnlab.json" and names[1].startswith("model-")
    atomic_write(tmp_path / "x.bin", b"new")
    assert (tmp_path / "x.bin").read_bytes() == b"new"


def test_is_checkpoint_rejects_other_directories(tmp_path):
    assert not is_checkpoint(tmp_path)
    assert not is_checkpoint(tmp_path / "missing")
    (tmp_path / "attnlab.json").write_text("{not json")
    (tmp_path / "model-00000000-0.safetensors").write_bytes(b"")
    assert not is_checkpoint(tmp_path)
    (tmp_path / "attnlab.json").write_text(json.dumps({"format": "something-else"}))
    assert not is_checkpoint(tmp_path)


def test_missing_or_mismatched_checkpoint_is_one_clear_error(tmp_path):
    with pytest.raises(AttnlabError, match="no attnlab checkpoint at"):
        load_checkpoint(tmp_path / "nowhere")
    model, tok = tiny_model()
    save_checkpoint(tmp_path, model, tok, state={"step": 3, "history": []})
    doc = json.loads((tmp_path / "attnlab.json").read_text())
    doc["state"]["step"] = 4  # as if the weights of step 4 never landed
    (tmp_path / "attnlab.json").write_text(json.dumps(doc))
    with pytest.raises(AttnlabError, match="incomplete"):
        load_checkpoint(tmp_path)
    doc["state"]["step"] = 3
    (tmp_path / "attnlab.json").write_text(json.dumps(doc))
    with pytest.raises(AttnlabError, match="cannot be resumed"):
        read_checkpoint(tmp_path, with_trainer=True)


def test_char_tokenizer_round_trip_and_display_tokens():
    text = load_corpus()
    tok = CharTokenizer.from_text(text)
    sample = text[1000:1500]
    assert tok.decode(tok.encode(sample)) == sample
    assert tok.tokens("a b\n") == ["a", "␣", "b", "\\n"]
    with pytest.raises(AttnlabError, match="not in the tokenizer's alphabet"):
        tok.encode("naïve")
    with pytest.raises(AttnlabError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


def test_bundled_corpus_is_english_and_states_its_license():
    text = load_corpus()
    assert len(text) > 150_000 and "Prospero" in text.title()
    assert "From fairest creatures we desire increase" in load_corpus("sonnets")
    assert "public domain" in corpus_license()
    with pytest.raises(AttnlabError, match="corpus: unknown"):
        load_corpus("klingon")


def test_a_crash_mid_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    from attnlab.models import checkpoint

    model, tok = tiny_model()
    save_checkpoint(tmp_path, model, tok, state={"step": 1, "history": []},
                    trainer_tensors={"m": torch.ones(2)})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for w in model.parameters():
            w.add_(1.0)
    real = checkpoint.atomic_write

    def crash_on_meta(path, data):
        if path.name == "attnlab.json":
            raise OSError("disk full")
        real(path, data)

    monkeypatch.setattr(checkpoint, "atomic_write", crash_on_meta)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, model, tok, state={"step": 2, "history": []},
                        trainer_tensors={"m": torch.zeros(2)})
    monkeypatch.undo()
    ck = read_checkpoint(tmp_path, with_trainer=True)
    assert ck.step == 1 and torch.equal(ck.trainer_tensors["m"], torch.ones(2))
    for k, v in before.items():
        assert torch.equal(ck.weights[k], v), k
    save_checkpoint(tmp_path, model, tok, state={"step": 3, "history": []})
    assert len(list(tmp_path.glob("*.safetensors"))) == 1  # leftovers of the crash are gone
