"""GPT-OSS (learned attention sinks, `s_aux`) through the HF adapter: a tiny random GptOss model
(built from its config class, no download) gives eager's logits, attentions and gradients,
the sinks' included, on attnlab. With sinks even a left-padded row with nothing to attend
agrees with eager: the sink takes all the mass in both (eager's additive mask is the dtype's
minimum, finite, so the sink logit dominates it), so every position is compared."""

from __future__ import annotations

import pytest
import torch
import transformers  # noqa: F401  (the hf extra: missing, these tests fail, never skip)

from attnlab.adapters import hf

from helpers import diff_report

#: ~7 s for the file, nearly all of it the first import of GPT-OSS's modeling code
pytestmark = pytest.mark.slow

B, L, VOCAB = 2, 9, 61


@pytest.fixture(scope="module")
def model():
    return _model()


def _model(window=4):
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(0)
    cfg = GptOssConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=32, head_dim=8,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       num_local_experts=2, num_experts_per_tok=1, sliding_window=window,
                       layer_types=["sliding_attention", "full_attention"],
                       max_position_embeddings=64, initializer_range=0.3)
    model = GptOssForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)  # sinks that matter
    return model


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, :3] = 0  # left padding: row 1's first positions attend nothing
    return ids, mask


def _run(model, impl):
    hf.register()
    model.set_attn_implementation(impl)
    ids, mask = _inputs()
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    (out.logits * torch.linspace(-1, 1, VOCAB)).sum().backward()
    sinks = [layer.self_attn.sinks.grad.clone() for layer in model.model.layers]
    return out.logits.detach(), [a.detach() for a in out.attentions], sinks


def test_gpt_oss_matches_eager_with_sinks(model):
    want_logits, want_att, want_sinks = _run(model, "eager")
    logits, att, sinks = _run(model, hf.NAME)
    assert torch.allclose(logits, want_logits, atol=1e-4), diff_report(logits, want_logits)
    for a, w in zip(att, want_att):
        assert torch.allclose(a, w, atol=1e-5), diff_report(a, w)
        assert (a.sum(-1) < 1 - 1e-4).any()  # the sinks took some mass
    for g, w in zip(sinks, want_sinks):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-5), diff_report(g, w)


def _ours_and_eager(model, call):
    """call(ids, mask) under attnlab and under eager attention, without gradients."""
    hf.register()
    ids, mask = _inputs()
    got = {}
    for impl in (hf.NAME, "eager"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            got[impl] = call(ids, mask)
    return got[hf.NAME], got["eager"]


def test_gpt_oss_without_attentions_is_the_fast_path(model):
    """No weights asked: the op alone (no weights recomputed), the same logits."""
    ours, eager = _ours_and_eager(
        model, lambda ids, mask: model(input_ids=ids, attention_mask=mask).logits)
    assert torch.allclose(ours, eager, atol=1e-4), diff_report(ours, eager)


def test_recording_with_sinks_refused(model):
    from attnlab import AttnlabError
    from attnlab.adapters import recording

    hf.register()
    model.set_attn_implementation(hf.NAME)
    ids, mask = _inputs()
    with recording.record(), pytest.raises(AttnlabError, match="s_aux"), torch.no_grad():
        model(input_ids=ids, attention_mask=mask)


def test_gpt_oss_generates_eager_tokens(model):
    """Cached decoding steps (one query row over the cache, the sinks in every step): the same
    greedy tokens as eager."""
    ours, eager = _ours_and_eager(model, lambda ids, mask: model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0))
    assert torch.equal(ours, eager), (ours, eager)
