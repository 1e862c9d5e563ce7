"""The HF adapter's mask builder (`adapters/hf_masks.py`): structured attnlab masks where they say
the call exactly (causal, sliding windows, left/right padding, a prefill and a decoding step),
transformers' dense mask otherwise; and a left-padded Llama-shaped batch on attnlab: the same
logits and the same greedy tokens as eager, its prefill on the interval kernel and its decoding
steps on the decode kernel."""

from __future__ import annotations

import pytest
import torch

from attnlab.masks import Mask

from helpers import spy_backends

transformers = pytest.importorskip("transformers")
from transformers.masking_utils import (  # noqa: E402
    causal_mask_function,
    sdpa_mask,
    sliding_window_causal_mask_function,
)

from attnlab.adapters import hf, hf_masks  # noqa: E402

LEFT = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
RIGHT = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]])


def dense_of(kw):
    return sdpa_mask(allow_is_causal_skip=False, **kw)  # (B, 1, L, S) bool


@pytest.mark.parametrize("pad", [None, LEFT, RIGHT])
@pytest.mark.parametrize("fn", ["causal", "window3"])
@pytest.mark.parametrize(("L", "S", "q_off"), [(7, 7, 0), (1, 7, 6), (2, 7, 5)])
def test_the_structured_mask_is_transformers_mask(pad, fn, L, S, q_off):
    mf = causal_mask_function if fn == "causal" else sliding_window_causal_mask_function(3)
    kw = dict(batch_size=2, q_length=L, kv_length=S, q_offset=q_off, kv_offset=0,
              mask_function=mf, attention_mask=pad, local_size=None if fn == "causal" else 3)
    got = hf_masks.attnlab_mask(**kw)
    assert isinstance(got, Mask), got
    want = dense_of(kw).expand(2, 1, L, S)
    assert torch.equal(got.to_dense(L, S).expand(2, 1, L, S), want)
    assert got.intervals(L, S) is not None  # what the interval and decode kernels take


def test_other_masks_stay_transformers_dense_ones():
    holes = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]])
    kw = dict(batch_size=2, q_length=4, kv_length=4, mask_function=causal_mask_function,
              attention_mask=holes)
    assert torch.equal(hf_masks.attnlab_mask(**kw), dense_of(kw))
    both = lambda b, h, q, k: q.new_ones((), dtype=torch.bool) & (k >= 0)  # noqa: E731
    got = hf_masks.attnlab_mask(batch_size=2, q_length=4, kv_length=4, mask_function=both,
                                attention_mask=None, allow_is_causal_skip=False)
    assert isinstance(got, torch.Tensor)


def _tiny_llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=97,
                      max_position_embeddings=1024)
    return LlamaForCausalLM(cfg).eval()


def test_a_left_padded_batch_gives_eagers_tokens_on_the_interval_and_decode_kernels(monkeypatch):
    hf.register()
    model = _tiny_llama()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 97, (2, 300), generator=g)
    am = torch.ones_like(ids)
    am[0, :40] = 0  # sequence 0 is left-padded by 40 tokens
    out = {}
    for impl in ("eager", "attnlab"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=am).logits
            used = spy_backends(monkeypatch) if impl == "attnlab" else []
            gen = model.generate(input_ids=ids, attention_mask=am, max_new_tokens=4,
                                 do_sample=False, pad_token_id=0)
        out[impl] = (logits, gen, list(used))
    (le, ge, _), (la, ga, used) = out["eager"], out["attnlab"]
    real = am.bool()
    assert (le[real] - la[real]).abs().max().item() < 1e-4
    assert torch.equal(ge, ga)
    assert "interval" in used and "decode" in used, used


def test_causal_and_window_masks_are_one_object_per_alignment_and_window():
    kw = dict(batch_size=2, q_length=1, kv_length=7, q_offset=6, kv_offset=0,
              mask_function=causal_mask_function, attention_mask=None)
    first = hf_masks.attnlab_mask(**kw)
    assert hf_masks.attnlab_mask(**{**kw, "kv_length": 8, "q_offset": 7}) is first
    assert hf_masks.attnlab_mask(**{**kw, "q_length": 2, "q_offset": 0}) is not first  # top-left
    win = {**kw, "mask_function": sliding_window_causal_mask_function(3), "local_size": 3}
    assert hf_masks.attnlab_mask(**win) is hf_masks.attnlab_mask(**win) is not first
    win4 = {**kw, "mask_function": sliding_window_causal_mask_function(4), "local_size": 4}
    assert hf_masks.attnlab_mask(**win4) is not hf_masks.attnlab_mask(**win)
    padded = hf_masks.attnlab_mask(**{**kw, "attention_mask": LEFT})  # its own key ranges
    assert padded is not hf_masks.attnlab_mask(**{**kw, "attention_mask": LEFT})


def test_every_decoding_step_after_the_first_finds_its_plans(monkeypatch):
    """One mask object per kind: a step's first layer takes the plan of the step before it (the
    full path validates the prompt's call and the first step's, nothing after)."""
    from attnlab.ops import api, decode_steps

    hf.register()
    model = _tiny_llama()
    model.set_attn_implementation("attnlab")
    full = []
    make = api.make_problem
    monkeypatch.setattr(api, "make_problem", lambda *a, **k: full.append(a[0].shape) or
                        make(*a, **k))
    decode_steps.clear()
    ids = torch.randint(3, 97, (1, 300), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.generate(input_ids=ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert [s[-2] for s in full] == [300, 1], full  # the prompt, the first step
