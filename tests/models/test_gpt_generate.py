"""Generation (seeded, cache = no cache, sliding window) and capture_attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import AttnlabError
from attnlab.capture import ModelAttention
from attnlab.models import GPT, CharTokenizer, GPTConfig, capture_attention, generate


def model_and_tok(rotary=False, kv=2, block=16, sharpen=True):
    torch.manual_seed(1)
    tok = CharTokenizer.from_text("abcdefgh \n")
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=block, n_layer=2, n_head=4,
                    n_kv_head=kv, n_embd=32, rotary=rotary, name="test")
    model = GPT(cfg).eval()
    if not sharpen:
        return model, tok
    with torch.no_grad():  # sharper logits than the 0.02-std init, so greedy choices are clear
        model.lm_head.weight.mul_(50)
    return model, tok


def test_generation_is_deterministic_under_a_seed():
    model, tok = model_and_tok()
    ids = tok.encode("abc")
    a = generate(model, ids, 30, temperature=1.0, seed=7)
    b = generate(model, ids, 30, temperature=1.0, seed=7)
    c = generate(model, ids, 30, temperature=1.0, seed=8)
    assert a == b and a != c
    assert a[:3] == ids and len(a) == 33
    state = torch.get_rng_state()
    generate(model, ids, 5, seed=1)
    assert torch.equal(state, torch.get_rng_state())  # the global RNG is left alone


@pytest.mark.parametrize("rotary", [False, True])
def test_greedy_with_cache_equals_recomputing_everything(rotary):
    model, tok = model_and_tok(rotary)
    ids = tok.encode("ab cd")
    got = generate(model, ids, 8, temperature=0)
    want = list(ids)
    with torch.no_grad():
        for _ in range(8):
            want.append(int(model(torch.tensor([want]))[0][0, -1].argmax()))
    assert got == want


@pytest.mark.parametrize("rotary, kv", [(False, 4), (True, 2), (True, 1)])
def test_gpt_kv_cache_decode_equals_full_forward(rotary, kv):
    model, _ = model_and_tok(rotary, kv, sharpen=False)
    ids = torch.randint(0, 10, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full, _ = model(ids)
        caches = model.new_caches(2)
        parts = [model(ids[:, :5], caches=caches)[0]]  # prefill
        parts += [model(ids[:, t:t + 1], caches=caches)[0] for t in range(5, 16)]  # decode
    d = (torch.cat(parts, 1) - full).abs().max().item()
    assert d <= 1e-5, f"max diff {d:.3e}"


def test_generation_slides_past_block_size():
    model, tok = model_and_tok(block=8)
    out = generate(model, tok.encode("abcdef"), 25, temperature=0.9, top_k=3, seed=0)
    assert len(out) == 31 and all(0 <= i < tok.vocab_size for i in out)


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -1.0}, "temperature"),
    ({"top_k": 0}, "top_k"),
    ({"max_new_tokens": -2}, "max_new_tokens"),
])
def test_bad_sampling_arguments(kwargs, message):
    model, _ = model_and_tok()
    args = {"max_new_tokens": 3, **kwargs}
    with pytest.raises(AttnlabError, match=message):
        generate(model, [0], args.pop("max_new_tokens"), **args)


@pytest.mark.parametrize("rotary, kv", [(False, 4), (True, 2), (False, 1)])
def test_capture_weights_equal_softmax_of_its_queries_and_keys(rotary, kv):
    model, tok = model_and_tok(rotary, kv)
    model.tokenizer = tok
    text = "abc de\nfgh"
    m = capture_attention(model, tok.encode(text))
    assert isinstance(m, ModelAttention)
    L = len(text)
    assert m.weights.shape == (2, 4, L, L) and m.queries.shape == (2, 4, L, 8)
    assert m.keys.shape == m.values.shape == (2, 4, L, 8) and m.weights.dtype == np.float64
    assert m.causal and np.array_equal(m.mask, np.tril(np.ones((L, L), dtype=bool)))
    assert m.tokens == tok.tokens(text) and m.scale == pytest.approx(8 ** -0.5)
    s = np.einsum("lhid,lhjd->lhij", m.queries, m.keys) * m.scale
    s = np.where(m.mask, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(m.weights, w, atol=1e-6)
    t = m.head_trace(1, 2)  # the viz hand-off recomputes the same weights
    np.testing.assert_allclose(t.weights, m.weights[1, 2], atol=1e-6)


def test_capture_weights_are_what_the_model_used():
    model, tok = model_and_tok(kv=2)
    ids = tok.encode("abcabc")
    m = capture_attention(model, ids)
    # the first layer's attention output rebuilt from the captured weights and values
    blk = model.blocks[0]
    with torch.no_grad():
        x = model.wte(torch.tensor([ids])) + model.wpe(torch.arange(len(ids)))
        y = blk.attn(blk.ln1(x))[0]  # (L, C)
    heads = torch.from_numpy(m.weights[0] @ m.values[0])  # (H, L, S) @ (H, S, D)
    rebuilt = blk.attn.out_proj(heads.transpose(0, 1).reshape(len(ids), -1).float())
    assert torch.allclose(rebuilt, y, atol=1e-5)
    assert m.tokens == [str(i) for i in ids]  # no tokenizer: the ids themselves


def test_capture_rejects_bad_ids():
    model, _ = model_and_tok()
    with pytest.raises(AttnlabError, match="block_size"):
        capture_attention(model, [0] * 17)
    with pytest.raises(AttnlabError, match="ids: expected ids in"):
        capture_attention(model, [99])
