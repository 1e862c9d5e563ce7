"""nn modules get their weights from one validated call (the op's Problem), never through the
package root: MultiHeadAttention(need_weights=True) and CausalSelfAttention's records."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

import attnlab.nn
from attnlab.nn import CausalSelfAttention, MultiHeadAttention
from attnlab.ops import validate

from helpers import assert_close


def count_validations(monkeypatch) -> list:
    calls = []
    real = validate.check_qkv
    monkeypatch.setattr(validate, "check_qkv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def test_mha_weights_from_one_validation(monkeypatch):
    torch.manual_seed(0)
    m = MultiHeadAttention(16, 4, num_kv_heads=2, batch_first=True).eval()
    x = torch.randn(2, 9, 16)
    calls = count_validations(monkeypatch)
    _, w = m(x, need_weights=True, average_attn_weights=False, is_causal=True)
    assert len(calls) == 1
    assert_close(w.sum(-1), torch.ones(2, 4, 9), atol=1e-6, what="rows sum to 1")
    assert bool((w.triu(1) == 0).all())


def test_causal_record_from_one_validation(monkeypatch):
    torch.manual_seed(0)
    attn = CausalSelfAttention(24, 4, n_kv_heads=2).eval()  # D = 6: scale 1/sqrt(6)
    x = torch.randn(1, 7, 24)
    calls = count_validations(monkeypatch)
    record = []
    attn(x, record=record)
    assert len(calls) == 1
    (r,) = record
    assert r.scale == validate.check_scale(None, 6)  # the scale the op used
    assert_close(r.weights.sum(-1), torch.ones(1, 4, 7), atol=1e-6, what="rows sum to 1")


def test_nn_does_not_import_the_package_root():
    for path in Path(attnlab.nn.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert all(a.name != "attnlab" for a in node.names), path.name
            if isinstance(node, ast.ImportFrom) and node.module == "attnlab":
                assert all(a.name in ("masks",) for a in node.names), (path.name, node.module)
