"""The HF adapter's masks against eager's formula: a caller's float mask together with a learned
position bias (T5), bool masks with a bias, and causality folded into the bias."""

from __future__ import annotations

import pytest
import torch

from attnlab.adapters import hf, recording


def _encoder():
    m = torch.nn.Module()
    m.is_causal = False  # without it transformers' convention is causal
    return m


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=g) for _ in range(3))
    bias = torch.randn(1, 4, 5, 5, generator=g) * 2  # T5: (1, H, L, S), shared over the batch
    return q, k, v, bias


def _eager(q, k, v, scores_add):
    w = torch.softmax(q @ k.transpose(-1, -2) + scores_add, -1)  # T5 does not scale
    return (w @ v).transpose(1, 2), w


@pytest.mark.parametrize("fill", [float("-inf"), torch.finfo(torch.float32).min])
def test_caller_float_mask_with_position_bias(fill):
    q, k, v, bias = _inputs()
    mask = torch.zeros(2, 1, 1, 5)
    mask[1, ..., 3:] = fill  # batch 1: keys 3, 4 are padding
    out, w = hf.attnlab_attention_forward(_encoder(), q, k, v, mask, scaling=1.0,
                                          position_bias=bias, output_attentions=True)
    assert w[1, ..., 3:].abs().max().item() == 0.0, "a padded key got weight"
    want_out, want_w = _eager(q, k, v, bias + mask)
    torch.testing.assert_close(w, want_w, atol=1e-6, rtol=0)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=0)
    plain, none = hf.attnlab_attention_forward(_encoder(), q, k, v, mask, scaling=1.0,
                                               position_bias=bias)
    assert none is None
    torch.testing.assert_close(plain, want_out, atol=1e-5, rtol=0)


def test_bool_mask_with_position_bias():
    q, k, v, bias = _inputs(1)
    keep = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    keep[0, ..., 4] = False
    out, w = hf.attnlab_attention_forward(_encoder(), q, k, v, keep, scaling=1.0,
                                          position_bias=bias, output_attentions=True)
    want_out, want_w = _eager(q, k, v, bias.masked_fill(~keep, float("-inf")))
    assert w[0, ..., 4].abs().max().item() == 0.0
    torch.testing.assert_close(w, want_w, atol=1e-6, rtol=0)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=0)


def test_causal_decoder_with_position_bias_and_no_mask():
    q, k, v, bias = _inputs(2)
    decoder = torch.nn.Module()
    decoder.is_causal = True
    out, w = hf.attnlab_attention_forward(decoder, q, k, v, None, scaling=1.0,
                                          position_bias=bias, output_attentions=True)
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)
    want_out, want_w = _eager(q, k, v, bias.masked_fill(future, float("-inf")))
    assert w[..., future].abs().max().item() == 0.0
    torch.testing.assert_close(w, want_w, atol=1e-6, rtol=0)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=0)


def test_a_recording_reproduces_gqa_softcap_and_a_float_mask():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 5, 8, generator=g) * 3
    k, v = (torch.randn(2, 2, 5, 8, generator=g) for _ in range(2))
    mask = torch.zeros(2, 1, 5, 5)
    mask[1, ..., 3:] = torch.finfo(torch.float32).min  # transformers' padding
    mask[0, ..., 1] = 0.5  # and a finite bias the op adds
    with recording.record() as calls:
        _, w = hf.attnlab_attention_forward(_encoder(), q, k, v, mask, scaling=0.3, softcap=2.0,
                                            output_attentions=True)
    (c,) = calls
    assert torch.equal(c.value, v.double().repeat_interleave(2, dim=-3))
    assert torch.equal(c.key, k.double().repeat_interleave(2, dim=-3))
    assert c.softcap == 2.0 and c.scale == 0.3
    assert c.allowed.dtype == torch.bool and not c.allowed[1, ..., 3:].any()
    s = 2.0 * torch.tanh(c.query @ c.key.transpose(-1, -2) * c.scale / 2.0)
    s = s + (c.bias if c.bias is not None else 0)
    want = torch.softmax(s.masked_fill(~c.allowed, float("-inf")), -1)
    torch.testing.assert_close(c.weights, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(w.double(), want, atol=1e-6, rtol=0)
