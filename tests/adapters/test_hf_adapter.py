"""attnlab as a transformers attention implementation: same numbers as the models' eager path."""

from __future__ import annotations

import pytest
import torch
import transformers  # noqa: F401  (the hf extra: missing, these tests fail, never skip)

from attnlab.adapters import hf, recording

from helpers import close


def test_register_is_idempotent():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert hf.register() == "attnlab"
    fn = AttentionInterface._global_mapping["attnlab"]
    assert hf.register() == "attnlab"
    assert AttentionInterface._global_mapping["attnlab"] is fn is hf.attnlab_attention_forward
    assert "attnlab" in AttentionMaskInterface._global_mapping


def _set(model, impl):
    model.set_attn_implementation(impl)
    assert model.config._attn_implementation == impl


def test_minilm_weights_equal_eager_with_padding(minilm):
    model, tok = minilm.model, minilm.tokenizer  # the packaged all-MiniLM-L6-v2, on attnlab
    enc = tok(["The cat sat on the mat because it was tired.", "Short one."],
              return_tensors="pt", padding=True)
    assert not enc["attention_mask"].all()  # the batch really is padded
    try:
        with torch.no_grad():
            _set(model, "eager")
            want = model(**enc, output_attentions=True)
            _set(model, "attnlab")
            got = model(**enc, output_attentions=True)
            plain = model(**enc)
    finally:
        _set(model, "attnlab")
    assert len(got.attentions) == len(want.attentions) == 6
    for layer, (g, w) in enumerate(zip(got.attentions, want.attentions)):
        assert g.shape == w.shape == (2, 12, enc["input_ids"].shape[1], enc["input_ids"].shape[1])
        close(g, w, 1e-5, f"layer {layer} weights")
    # padded keys get exactly zero weight
    pad = ~enc["attention_mask"][1].bool()
    assert got.attentions[0][1][..., pad].abs().max().item() == 0.0
    close(got.last_hidden_state, want.last_hidden_state, 1e-4, "hidden states")
    assert plain.attentions is None  # weights cost nothing unless asked for
    assert torch.equal(plain.last_hidden_state, got.last_hidden_state)


def _left_padded(vocab: int):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    mask[2, :1] = 0
    ids[mask == 0] = 0
    return ids, mask


def _compare_logits(model, ids, mask, atol=1e-5):
    model.eval()
    with torch.no_grad():
        _set(model, "eager")
        want = model(input_ids=ids, attention_mask=mask, output_attentions=True)
        _set(model, "attnlab")
        got = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    real = mask.bool()
    close(got.logits[real], want.logits[real], atol, "logits at real tokens")
    for g, w in zip(got.attentions, want.attentions):
        rows = real[:, None, :, None]  # eager spreads a fully masked (pad) query row uniformly
        close(torch.where(rows, g, 0), torch.where(rows, w, 0), 1e-5, "weights")
        # causal: no weight on the future
        assert g.triu(1).abs().max().item() == 0.0
    return got


def test_llama_gqa_left_padded_logits_equal_eager():
    from transformers import LlamaConfig, LlamaForCausalLM

    hf.register()
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    ids, mask = _left_padded(97)
    got = _compare_logits(model, ids, mask)
    # the padding reached attnlab: a padded row's real tokens give pad keys no weight
    assert got.attentions[0][1, :, 5:, :4].abs().max().item() == 0.0


def test_gpt2_left_padded_logits_equal_eager():
    from transformers import GPT2Config, GPT2LMHeadModel

    hf.register()
    cfg = GPT2Config(vocab_size=97, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg)
    ids, mask = _left_padded(97)
    _compare_logits(model, ids, mask)


def test_llama_without_mask_is_causal_and_decoding_matches():
    from transformers import LlamaConfig, LlamaForCausalLM

    hf.register()
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=32)
    torch.manual_seed(2)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 50, (1, 9))
    with torch.no_grad():
        _set(model, "eager")
        want = model(input_ids=ids).logits
        _set(model, "attnlab")
        full = model(input_ids=ids).logits
        # prefill then one decoding step through the KV cache (one query row, no mask)
        pre = model(input_ids=ids[:, :-1], use_cache=True)
        step = model(input_ids=ids[:, -1:], cache=pre.cache).logits
    close(full, want, 1e-5, "logits")
    close(step[:, -1], want[:, -1], 1e-5, "decode-step logits")


def test_record_captures_every_layer_and_head(minilm):
    model, tok = minilm.model, minilm.tokenizer  # the packaged all-MiniLM-L6-v2, on attnlab
    enc = tok("The cat sat.", return_tensors="pt")
    with torch.no_grad(), recording.record() as calls:
        out = model(**enc, output_attentions=True)
    assert [c.layer for c in calls] == list(range(6))
    L = enc["input_ids"].shape[1]
    for c, w in zip(calls, out.attentions):
        assert c.query.dtype == torch.float64 and c.query.shape == (1, 12, L, 32)
        assert c.weights.shape == (1, 12, L, L)
        close(c.weights, w, 1e-6, "recorded weights")
        # the recorded q, k, mask and scale reproduce the weights
        s = (c.query @ c.key.transpose(-1, -2)) * c.scale
        s = s.masked_fill(~c.allowed, float("-inf"))
        close(torch.softmax(s, -1), c.weights, 1e-5, "softmax of recorded scores")
    assert not recording.recording()


def test_softcap_and_sinks_pass_through():
    from attnlab import AttnlabError

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4) * 4 for _ in range(3))
    encoder = torch.nn.Module()
    encoder.is_causal = False  # without it transformers' convention is causal
    out, w = hf.attnlab_attention_forward(encoder, q, k, v, None, scaling=0.5,
                                          softcap=2.0, output_attentions=True)
    s = 2.0 * torch.tanh((q @ k.transpose(-1, -2)) * 0.5 / 2.0)  # Gemma 2's eager order
    want = torch.softmax(s, -1)
    close(w, want, 1e-6, "softcapped weights")
    close(out, (want @ v).transpose(1, 2), 1e-5, "softcapped output")
    out, w = hf.attnlab_attention_forward(encoder, q, k, v, None, scaling=0.5,
                                          s_aux=torch.tensor([0.0, 1.0]), output_attentions=True)
    s = (q @ k.transpose(-1, -2)) * 0.5  # GPT-OSS's eager: the sink's logit in the softmax
    e = torch.exp(s)
    want = e / (e.sum(-1, keepdim=True) + torch.tensor([0.0, 1.0]).exp()[:, None, None])
    close(w, want, 1e-6, "weights with sinks")
    close(out, (want @ v).transpose(1, 2), 1e-5, "output with sinks")
    with pytest.raises(AttnlabError, match="sinks: expected shape"):
        hf.attnlab_attention_forward(encoder, q, k, v, None, s_aux=torch.zeros(3))


def test_t5_position_bias_encoder_decoder_equal_eager():
    from transformers import T5Config, T5Model

    hf.register()
    cfg = T5Config(vocab_size=60, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, dropout_rate=0.0)
    torch.manual_seed(0)
    model = T5Model(cfg).eval()
    ids, mask = _left_padded(60)
    dec = torch.randint(1, 60, (3, 6))
    with torch.no_grad():
        _set(model, "eager")
        want = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec,
                     output_attentions=True)
        _set(model, "attnlab")
        got = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec,
                    output_attentions=True)
    close(got.last_hidden_state, want.last_hidden_state, 1e-5, "decoder output")
    real = mask.bool()
    close(got.encoder_last_hidden_state[real], want.encoder_last_hidden_state[real], 1e-5,
                 "encoder output")
    for g, w in zip(got.decoder_attentions, want.decoder_attentions):
        close(g, w, 1e-5, "decoder self-attention weights (causal + position bias)")
