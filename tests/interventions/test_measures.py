"""The measures on hand-built numbers and against what they stand for: text_loss is the model's
own loss, mean pooling matches sentence-transformers' all-MiniLM-L6-v2 embeddings, the logit
lens's last layer is the model's logits."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab import AttnlabError
from attnlab.interventions import (
    Ablate,
    embedding_similarity,
    intervene,
    logit_difference,
    logit_lens,
    mean_pool,
    next_token_logprob,
    sweep,
    text_loss,
    token_cosine,
)
from interventions import models
from interventions.test_exact import IDS


def test_next_token_logprob_and_logit_difference_on_known_logits():
    logits = torch.zeros(2, 3, 4)
    logits[0, -1] = torch.tensor([0.0, math.log(3.0), 0.0, 0.0])  # p = (1, 3, 1, 1) / 6
    assert next_token_logprob(logits, 1)[0].item() == pytest.approx(math.log(0.5))
    assert next_token_logprob(logits, 1)[1].item() == pytest.approx(math.log(0.25))
    assert logit_difference(logits, 1, 0).tolist() == pytest.approx([math.log(3.0), 0.0])
    with pytest.raises(AttnlabError, match="position"):
        next_token_logprob(logits, 1, position=3)


@torch.no_grad()
def test_text_loss_is_the_models_loss_and_spans_split_it():
    model = models.gpt()
    _, loss = model(IDS[:, :-1], IDS[:, 1:])
    full = model(IDS)[0]
    L = IDS.shape[1]
    assert text_loss(full, IDS[0])[0].item() == pytest.approx(loss.item(), rel=1e-6)
    first, second = text_loss(full, IDS[0], 1, 6), text_loss(full, IDS[0], 6, L)
    assert ((first * 5 + second * (L - 6)) / (L - 1)).item() == pytest.approx(loss.item(),
                                                                            rel=1e-6)
    with pytest.raises(AttnlabError, match="start, end"):
        text_loss(full, IDS[0], 0)


@pytest.mark.parametrize("name", ["gpt", "gpt2", "llama"])
@torch.no_grad()
def test_the_logit_lens_ends_in_the_models_logits(name):
    model = getattr(models, name)()
    if name == "gpt":
        run = lambda: model(IDS)[0]  # noqa: E731
    else:
        run = lambda: model(input_ids=IDS, use_cache=False).logits  # noqa: E731
    lens = logit_lens(model, run)
    assert lens.shape == (4, 1, IDS.shape[1], models.VOCAB)
    assert torch.allclose(lens[-1], run(), atol=1e-5)
    assert not torch.allclose(lens[0], lens[-1], atol=1e-2)


def test_the_logit_lens_refuses_an_encoder(minilm):
    with pytest.raises(AttnlabError, match="causal language model"):
        logit_lens(minilm.model, lambda: None)


@pytest.mark.slow  # loads sentence-transformers
@torch.no_grad()
def test_mean_pooling_matches_sentence_transformers(minilm):
    from sentence_transformers import SentenceTransformer

    from attnlab.explain.model import default_model_path

    st = SentenceTransformer(str(default_model_path()), device="cpu")
    a, b = "The cat sat on the mat.", "A dog slept on the rug all day."
    want = torch.nn.functional.cosine_similarity(
        *map(torch.as_tensor, st.encode([a, b])), dim=0).item()
    ea, eb = (minilm.tokenizer(t, return_tensors="pt") for t in (a, b))
    ha, hb = (minilm.model(**e).last_hidden_state for e in (ea, eb))
    got = embedding_similarity(ha, hb, ea["attention_mask"], eb["attention_mask"])
    assert got.item() == pytest.approx(want, abs=1e-5)
    assert mean_pool(ha).shape == (1, 384)


@torch.no_grad()
def test_token_cosine_of_a_sweep_is_one_for_the_unedited_row(minilm):
    enc = minilm.tokenizer("The cat sat on the mat because it was tired.", return_tensors="pt")
    model = minilm.model
    out, _ = sweep(model, lambda: model(**enc).last_hidden_state, heads=[(0, 1), (5, 2)])
    cos = token_cosine(out, out[0], 8)
    assert cos[0].item() == pytest.approx(1.0, abs=1e-12)
    with intervene(model, Ablate(5, 2)):
        alone = model(**enc).last_hidden_state
    assert cos[2].item() == pytest.approx(token_cosine(alone, out[0], 8).item(), abs=1e-6)
    assert (cos[1:] < 1 - 1e-6).all()
