"""attnlab under transformers across architectures: tiny random models (built from config classes,
float32, eval mode, fixed seeds) with a padded batch give eager's logits, every attention it
returns (self and cross) and its greedy generations.

Padding follows each model: decoder-only models are left-padded (what generation needs), BERT and
T5's encoder right-padded. A left-padded causal model has query rows with nothing to attend to
(a pad token sees only pad tokens before it). There the two paths differ by definition: attnlab
gives such a row weight 0 and output 0, eager's additive mask leaves a row of equal scores that
softmax spreads evenly over all keys. So the test checks that attnlab leaves exactly the padding
rows empty, and compares weights (self and cross) and logits at the real query positions; for
right-padded encoders no row is empty and every position is compared. The pad positions' outputs
differ, but no real token attends them, so nothing downstream of a real token changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import transformers  # noqa: F401  (the hf extra: missing, these tests fail, never skip)

from attnlab.adapters import hf

from helpers import diff_report

ATOL = 1e-5
VOCAB = 97
B, L = 3, 11
NEW_TOKENS = 4
INIT = 0.2  # larger than the 0.02 default: peaked attention, so masks and softcap matter


@dataclass(frozen=True)
class Arch:
    name: str
    build: Callable[[], torch.nn.Module]
    padding: str  # "left" or "right"
    seq2seq: bool = False
    generates: bool = True
    extra: Callable[[], dict] = dict  # further inputs to forward and generate
    generate_extra: Callable[[], dict] = dict  # further inputs to generate only
    windows: tuple[int | None, ...] = (None, None)  # each layer's sliding window, if any


def _bert():
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, initializer_range=INIT,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def _bert_decoder():  # BERT as a causal LM with cross-attention to a padded encoder output
    from transformers import BertConfig, BertLMHeadModel

    return BertLMHeadModel(BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, initializer_range=INIT,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, is_decoder=True,
        add_cross_attention=True))


def _encoder_states():
    """encoder_hidden_states (B, 7, 32) and a right-padded encoder_attention_mask (B, 7)."""
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(B, 7, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 6:] = 0
    return dict(encoder_hidden_states=torch.randn(B, 7, 32, generator=g),
                encoder_attention_mask=mask)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, initializer_range=INIT,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2))


def _llama():  # grouped-query attention: 4 query heads share 2 key/value heads
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        initializer_range=INIT, bos_token_id=1, eos_token_id=2))


def _mistral():  # a 4-token sliding window over 11 tokens (+4 generated)
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(MistralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        sliding_window=4, initializer_range=INIT, bos_token_id=1, eos_token_id=2))


def _qwen2():  # layer 0 full attention, layer 1 a 4-token sliding window; biased q/k/v
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        use_sliding_window=True, sliding_window=4, max_window_layers=1, initializer_range=INIT,
        bos_token_id=1, eos_token_id=2))


def _gemma2():  # attention-logit softcap small enough to bend scores; sliding and full layers
    from transformers import Gemma2Config, Gemma2ForCausalLM

    return Gemma2ForCausalLM(Gemma2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=32,
        sliding_window=4, attn_logit_softcapping=1.0, query_pre_attn_scalar=8,
        initializer_range=INIT, pad_token_id=0, bos_token_id=1, eos_token_id=2))


def _t5():  # learned relative position bias; decoder self- and cross-attention
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, dropout_rate=0.0,
        pad_token_id=0, eos_token_id=2, decoder_start_token_id=0))


def _cross_cache():
    # generate() hands BertLMHeadModel a plain DynamicCache, which its cross-attention cannot use
    # (AttributeError under eager too); the cache it needs, given explicitly
    from transformers import DynamicCache, EncoderDecoderCache

    return dict(cache=EncoderDecoderCache(DynamicCache(), DynamicCache()))


ARCHS = [
    Arch("bert", _bert, "right", generates=False),
    Arch("bert-decoder", _bert_decoder, "left", extra=_encoder_states,
         generate_extra=_cross_cache),
    Arch("gpt2", _gpt2, "left"),
    Arch("llama-gqa", _llama, "left"),
    Arch("mistral-sliding", _mistral, "left", windows=(4, 4)),
    Arch("qwen2", _qwen2, "left", windows=(None, 4)),
    Arch("gemma2-softcap", _gemma2, "left", windows=(4, None)),
    Arch("t5", _t5, "right", seq2seq=True),
]

BY_NAME = {a.name: a for a in ARCHS}
_MODELS: dict[str, torch.nn.Module] = {}


def model_for(arch: Arch) -> torch.nn.Module:
    if arch.name not in _MODELS:
        hf.register()
        torch.manual_seed(0)
        _MODELS[arch.name] = arch.build().eval()
    return _MODELS[arch.name]


def padded_batch(side: str):
    """ids, attention_mask (B, L): row 0 full, rows 1 and 2 with 4 and 1 pad tokens."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (B, L), generator=g)
    mask = torch.ones_like(ids)
    for row, pads in ((1, 4), (2, 1)):
        if side == "left":
            mask[row, :pads] = 0
        else:
            mask[row, L - pads:] = 0
    ids[mask == 0] = 0
    return ids, mask


def run(model, impl: str, fn):
    model.set_attn_implementation(impl)
    assert model.config._attn_implementation == impl
    with torch.no_grad():
        return fn()


def attention_outputs(out) -> dict[str, tuple]:
    kinds = ("attentions", "encoder_attentions", "decoder_attentions", "cross_attentions")
    return {k: getattr(out, k) for k in kinds if getattr(out, k, None) is not None}


def max_diff(got, want) -> float:
    assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    return (got.double() - want.double()).abs().max().item() if got.numel() else 0.0


def check_close(got, want, what):
    d = max_diff(got, want)
    assert d <= ATOL, f"{what}: {diff_report(got, want)} (atol {ATOL})"
    return d


def compare_forward(arch: Arch) -> dict[str, float]:
    """Max differences attnlab vs eager: logits and every attention tensor the model returns."""
    model = model_for(arch)
    ids, mask = padded_batch(arch.padding)
    inputs = dict(input_ids=ids, attention_mask=mask, output_attentions=True, **arch.extra())
    if arch.seq2seq:
        inputs["decoder_input_ids"] = torch.randint(
            3, VOCAB, (B, 6), generator=torch.Generator().manual_seed(2))
    want = run(model, "eager", lambda: model(**inputs))
    got = run(model, "attnlab", lambda: model(**inputs))
    want_att = {k: v for k, v in attention_outputs(want).items() if v}  # GPT-2: cross_attentions=()
    got_att = attention_outputs(got)
    assert want_att and want_att.keys() <= got_att.keys(), f"attnlab returned {list(got_att)}"
    for kind, want_layers in want_att.items():
        assert len(got_att[kind]) == len(want_layers) == model.config.num_hidden_layers, (
            f"{kind}: {len(got_att[kind])} tensors from attnlab, {len(want_layers)} from eager")
        for layer, (g, w) in enumerate(zip(got_att[kind], want_layers)):
            assert g is not None and g.shape == w.shape, f"{arch.name} {kind}[{layer}]"
            sums = g.double().sum(-1)  # (B, H, L): 1, or 0 for a row with nothing to attend
            assert ((sums - 1).abs() < 1e-5).logical_or(sums == 0).all(), f"{kind}[{layer}]"
    # query positions whose self-attention row is empty in some layer or head, and so everything
    # computed at that position afterwards: only padding of a left-padded causal model
    real = mask.bool()
    self_kind = "encoder_attentions" if arch.seq2seq else "attentions"
    empty = torch.stack([g.sum(-1) == 0 for g in got_att[self_kind]]).any(0).any(1)  # (B, L)
    if arch.padding == "left":  # causal: a pad token sees only pads, a real token itself
        assert torch.equal(empty, ~real), f"{arch.name}: empty rows {empty.tolist()}"
    else:  # every query sees the real tokens
        assert not empty.any(), f"{arch.name}: empty rows {empty.tolist()}"
    for layer, window in enumerate(arch.windows):  # the window is shorter than the sequence
        last = got_att[self_kind][layer][0, :, L - 1]  # (H, S) of the unpadded sequence
        outside = last[:, :L - window].abs().max() if window else None
        assert window is None or outside == 0, f"layer {layer}: weight {outside} outside window"
    diffs: dict[str, float] = {}
    for kind, want_layers in want_att.items():
        # empty rows come only from left-padded decoder-only models, where every kind of
        # attention (BERT's cross-attention too) has the prompt positions as its queries
        rows = ~empty[:, None, :, None] if empty.any() else torch.tensor(True)  # (B, 1, L, 1)
        for layer, (g, w) in enumerate(zip(got_att[kind], want_layers)):
            d = check_close(torch.where(rows, g, 0), torch.where(rows, w, 0),
                            f"{arch.name} {kind}[{layer}] on {int(rows.sum())} query rows")
            diffs[kind] = max(diffs.get(kind, 0.0), d)
    logits_g, logits_w = got.logits, want.logits  # seq2seq: the decoder's, all compared
    if not arch.seq2seq:
        logits_g, logits_w = logits_g[~empty], logits_w[~empty]
    diffs["logits"] = check_close(logits_g, logits_w, f"{arch.name} logits")
    return diffs


@pytest.mark.parametrize("arch", ARCHS, ids=[a.name for a in ARCHS])
def test_padded_batch_logits_and_every_attention_equal_eager(arch):
    diffs = compare_forward(arch)
    assert set(diffs) > {"logits"}


@pytest.mark.parametrize("arch", [a for a in ARCHS if a.generates],
                         ids=[a.name for a in ARCHS if a.generates])
def test_greedy_generation_equals_eager(arch):
    """Greedy tokens through prefill and cached decoding steps (past the sliding windows), and,
    asked for, every step's attention weights."""
    model = model_for(arch)
    ids, mask = padded_batch(arch.padding)

    def generate(**extra):
        return lambda: model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, **arch.extra(),
            **arch.generate_extra(), **extra)

    want = run(model, "eager", generate())
    got = run(model, "attnlab", generate())
    assert want.shape[1] == (1 if arch.seq2seq else L) + NEW_TOKENS
    assert torch.equal(got, want), f"{arch.name}: attnlab {got.tolist()} != eager {want.tolist()}"

    steps = dict(output_attentions=True, return_dict_in_generate=True)
    want, got = run(model, "eager", generate(**steps)), run(model, "attnlab", generate(**steps))
    assert torch.equal(got.sequences, want.sequences)
    prefill_rows = mask.bool()[:, None, :, None]  # (B, 1, L, 1): real query rows of the prompt
    for kind in ("attentions", "decoder_attentions", "cross_attentions"):
        want_steps = getattr(want, kind, None)
        if want_steps is None:
            continue
        assert len(getattr(got, kind)) == len(want_steps) == NEW_TOKENS, kind
        for step, (got_layers, want_layers) in enumerate(zip(getattr(got, kind), want_steps)):
            for layer, (g, w) in enumerate(zip(got_layers, want_layers, strict=True)):
                rows = prefill_rows if step == 0 and not arch.seq2seq else torch.tensor(True)
                check_close(torch.where(rows, g, 0), torch.where(rows, w, 0),
                            f"{arch.name} {kind} step {step} layer {layer}")


@pytest.mark.parametrize("padded", [True, False], ids=["padding-mask", "causal-no-mask"])
def test_weights_beyond_one_block_of_rows_equal_eager(padded):
    """More query rows than the adapter recomputes at a time: the second block's rows still line
    up with their mask rows (a dense padding mask, or is_causal with no mask at all)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    n = hf.WEIGHT_ROWS + 7
    hf.register()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_positions=n, n_embd=16, n_layer=1, n_head=2, initializer_range=INIT,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).eval()
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(3, VOCAB, (2 if padded else 1, n), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :5] = 0  # left padding: rows 0-4 of sequence 1 see nothing
    inputs = dict(input_ids=ids, attention_mask=mask, output_attentions=True)
    want = run(model, "eager", lambda: model(**inputs))
    got = run(model, "attnlab", lambda: model(**inputs))
    (g,), (w,) = got.attentions, want.attentions
    real = mask.bool()[:, None, :, None]  # (B, 1, L, 1)
    check_close(torch.where(real, g, 0), torch.where(real, w, 0), "weights")
    assert g[..., hf.WEIGHT_ROWS:, :].triu(hf.WEIGHT_ROWS + 1).abs().max() == 0  # causal, block 2
    check_close(got.logits[mask.bool()], want.logits[mask.bool()], "logits")


def test_weights_are_computed_only_while_transformers_collects_them(monkeypatch):
    model = model_for(BY_NAME["gpt2"])  # GPT-2: output_attentions never reaches its attention calls
    ids, mask = padded_batch("left")
    calls = []
    exact = hf.run_with_weights
    monkeypatch.setattr(hf, "run_with_weights", lambda *a, **k: calls.append(1) or exact(*a, **k))
    # collecting hidden states only: output capturing is active, attentions are not wanted
    out = run(model, "attnlab", lambda: model(input_ids=ids, attention_mask=mask,
                                              output_hidden_states=True))
    assert len(out.hidden_states) == 3 and out.attentions is None and calls == []
    out = run(model, "attnlab", lambda: model(input_ids=ids, attention_mask=mask,
                                              output_attentions=True))
    assert len(out.attentions) == 2 and len(calls) == 2


def _gpt2_cross():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, initializer_range=INIT,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, add_cross_attention=True))


@pytest.mark.parametrize("arch", [Arch("gpt2-cross", _gpt2_cross, "none"), BY_NAME["t5"]],
                         ids=["gpt2-cross", "t5"])
def test_without_any_mask_causality_comes_from_each_module(arch):
    """No padding: transformers passes no mask at all, and each attention module says whether it
    is causal (GPT-2's and T5's decoder self-attention) or not (their cross-attention, T5's
    encoder)."""
    model = model_for(arch)
    ids = torch.randint(3, VOCAB, (2, L), generator=torch.Generator().manual_seed(5))
    inputs = dict(input_ids=ids, output_attentions=True)
    if arch.seq2seq:
        inputs["decoder_input_ids"] = ids[:, :6]
    else:
        g = torch.Generator().manual_seed(6)
        inputs["encoder_hidden_states"] = torch.randn(2, 7, 32, generator=g)
    want = run(model, "eager", lambda: model(**inputs))
    got = run(model, "attnlab", lambda: model(**inputs))
    want_att, got_att = attention_outputs(want), attention_outputs(got)
    assert "cross_attentions" in want_att and want_att.keys() == got_att.keys()
    for kind, want_layers in want_att.items():
        assert len(got_att[kind]) == len(want_layers) == 2, kind
        for layer, (g, w) in enumerate(zip(got_att[kind], want_layers)):
            check_close(g, w, f"{arch.name} {kind}[{layer}]")
    check_close(got.logits, want.logits, f"{arch.name} logits")


def weights_from_record(c) -> torch.Tensor:
    """The weights an `AttentionCall` says it used, recomputed from what it recorded."""
    s = c.query @ c.key.transpose(-1, -2) * c.scale  # (B, H, L, D) @ (B, H, D, S) -> (B, H, L, S)
    if c.softcap is not None:
        s = c.softcap * torch.tanh(s / c.softcap)
    if c.bias is not None:
        s = s + c.bias
    w = torch.softmax(s.masked_fill(~c.allowed, float("-inf")), -1)
    return torch.nan_to_num(w, nan=0.0)  # a row with nothing allowed: 0


@pytest.mark.parametrize("name", ["gemma2-softcap", "t5", "mistral-sliding", "bert"])
def test_recorded_calls_reproduce_their_weights(name):
    """Softcap (Gemma 2) and position bias (T5) are part of the record, so q, k, scale, softcap,
    bias and mask give back the weights the model used, layer by layer and head by head."""
    from attnlab.adapters import recording

    arch = BY_NAME[name]
    model = model_for(arch)
    ids, mask = padded_batch(arch.padding)
    inputs = dict(input_ids=ids, attention_mask=mask)
    if arch.seq2seq:
        inputs["decoder_input_ids"] = ids[:, :6]
    with recording.record() as calls:
        run(model, "attnlab", lambda: model(**inputs))
    assert len(calls) == (6 if arch.seq2seq else 2)  # T5: encoder self, decoder self and cross
    for i, c in enumerate(calls):
        check_close(weights_from_record(c), c.weights, f"{name} call {i} (layer {c.layer})")
    softcaps = [c.softcap for c in calls]
    assert softcaps == ([1.0, 1.0] if name == "gemma2-softcap" else [None] * len(calls))
    biased = [c.bias is not None for c in calls]  # T5's cross-attention has no position bias
    assert sum(biased) == (4 if name == "t5" else 0)


def test_a_recorded_call_with_weights_is_validated_once(monkeypatch):
    """Output, weights and the recording of one attention call come from one validated call."""
    from attnlab.adapters import recording
    from attnlab.ops import validate

    model = model_for(BY_NAME["gpt2"])
    ids, mask = padded_batch("left")
    checked = []
    check = validate.check_qkv  # every validation of a call, whoever asks for it, starts here
    monkeypatch.setattr(validate, "check_qkv", lambda *a, **k: checked.append(1) or check(*a, **k))
    with recording.record() as calls:
        out = run(model, "attnlab", lambda: model(input_ids=ids, attention_mask=mask,
                                                  output_attentions=True))
    assert len(out.attentions) == len(calls) == 2
    assert len(checked) == 2  # one per layer: not again for the weights' row blocks or the record
