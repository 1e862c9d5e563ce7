"""attention_with_weights: one validated call gives the output and the exact weights of the rows
asked for (in row blocks for long L), with the same scale, masks and modifiers as the output."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks
from attnlab.ops import api, attention_with_weights, validate

from helpers import assert_close, qkv

CASES = {
    "none": {},
    "causal": {"is_causal": True},
    "sliding_gqa": {"mask": masks.sliding_window(5), "enable_gqa": True},
    "document_bias": {"mask": masks.document(torch.arange(23) // 6),
                      "attn_mask": torch.randn(23, 23, generator=torch.Generator().manual_seed(2))},
    "modifiers": {"is_causal": True, "softcap": 4.0, "alibi_slopes": torch.tensor([.5, .25]),
                  "scale": 0.3},
}


def inputs(name):
    return qkv(2, 2, 1 if name == "sliding_gqa" else 2, 23, 23, 8, dtype=torch.float64, seed=3)


@pytest.mark.parametrize("name", CASES)
def test_matches_attention_and_attention_weights(name):
    q, k, v = inputs(name)
    kw = CASES[name]
    out, lse, w = attention_with_weights(q, k, v, return_lse=True, **kw)
    want_out, want_lse = attnlab.attention(q, k, v, return_lse=True, **kw)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    assert torch.equal(w, attnlab.attention_weights(q, k, lse, **kw))
    g = q.shape[-3] // k.shape[-3]
    assert_close(w @ v.repeat_interleave(g, -3), out, atol=1e-12, what="weights @ v")


@pytest.mark.parametrize("rows", [[22, 0, 5], slice(3, 20, 4), 7])
def test_rows(rows):
    q, k, v = inputs("causal")
    _, w = attention_with_weights(q, k, v, is_causal=True, rows=rows)
    full = attention_with_weights(q, k, v, is_causal=True)[1]
    idx = torch.arange(23)[rows] if isinstance(rows, slice) else torch.tensor(rows).reshape(-1)
    assert_close(w, full[..., idx, :], atol=1e-15, rtol=1e-13, what=f"rows={rows}")


def test_row_blocks_equal_one_block():
    q, k, v = inputs("document_bias")
    p = api.make_problem(q, k, v, CASES["document_bias"]["attn_mask"], 0.0, False, None, False,
                         mask=CASES["document_bias"]["mask"])
    _, _, one = api.run_with_weights(p)
    _, _, blocks = api.run_with_weights(p, row_block=4)  # 23 rows in 6 blocks
    assert_close(blocks, one, atol=1e-15, rtol=1e-13, what="4-row blocks vs one block")


def test_validates_once(monkeypatch):
    q, k, v = inputs("causal")
    calls = []
    real = validate.check_qkv
    monkeypatch.setattr(validate, "check_qkv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(api, "WEIGHT_ROWS", 4)  # several row blocks, still one validation
    attention_with_weights(q, k, v, is_causal=True)
    assert len(calls) == 1


def test_bad_input_named():
    q, k, v = inputs("none")
    with pytest.raises(AttnlabError, match="rows"):
        attention_with_weights(q, k, v, rows=[99])
    with pytest.raises(AttnlabError, match="backend"):
        attention_with_weights(q, k, v, backend="fast")
