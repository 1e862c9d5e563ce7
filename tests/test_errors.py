"""Bad input raises AttnlabError (a ValueError) naming the argument and showing shapes/values."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks


def t(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


Q, K, V = t(2, 4, 7, 64), t(2, 4, 7, 64), t(2, 4, 7, 64)

CASES = [
    ("head dim", dict(key=t(2, 4, 7, 32)),
     r"key: expected \(B, Hkv, S, D\) = \(2, 4, 7, 64\).*got \(2, 4, 7, 32\)"),
    ("batch", dict(key=t(3, 4, 7, 64), value=t(3, 4, 7, 64)), r"key: .*got \(3, 4, 7, 64\)"),
    ("value length", dict(value=t(2, 4, 8, 64)), r"value: .*\(2, 4, 8, 64\)"),
    ("ndim", dict(key=t(4, 7, 64)), r"query, key, value: expected the same number of dims"),
    ("1-D", dict(query=t(64), key=t(64), value=t(64)), r"query: expected at least 2 dims"),
    ("gqa off", dict(key=t(2, 2, 7, 64), value=t(2, 2, 7, 64)), r"enable_gqa=True"),
    ("gqa multiple", dict(key=t(2, 3, 7, 64), value=t(2, 3, 7, 64), enable_gqa=True),
     r"enable_gqa: query heads H=4 must be a multiple of key/value heads Hkv=3"),
    ("int dtype", dict(query=torch.ones(2, 4, 7, 64, dtype=torch.int64)),
     r"query: expected a floating-point tensor, got dtype torch.int64"),
    ("mixed dtypes", dict(value=t(2, 4, 7, 64, dtype=torch.float64)),
     r"query, key, value: expected one dtype"),
    ("not a tensor", dict(query=[[1.0]]), r"query: expected a torch.Tensor, got list"),
    ("mask shape", dict(attn_mask=torch.ones(7, 6, dtype=torch.bool)),
     r"attn_mask: shape \(7, 6\) does not broadcast to the scores .* = \(2, 4, 7, 7\)"),
    ("mask batch", dict(attn_mask=torch.ones(3, 1, 7, 7, dtype=torch.bool)),
     r"attn_mask: shape \(3, 1, 7, 7\)"),
    ("mask dtype", dict(attn_mask=torch.ones(7, 7, dtype=torch.int32)),
     r"attn_mask: expected a bool or floating-point tensor"),
    ("dropout high", dict(dropout_p=1.5),
     r"dropout_p: expected a probability in \[0, 1\], got 1.5"),
    ("dropout negative", dict(dropout_p=-0.1), r"dropout_p: .*-0.1"),
    ("scale nan", dict(scale=float("nan")), r"scale: expected a finite number"),
    ("scale inf", dict(scale=float("inf")), r"scale: expected a finite number"),
    ("backend", dict(backend="fast"), r"backend: expected one of .* got 'fast'"),
    ("structured mask type", dict(mask=torch.ones(7, 7, dtype=torch.bool)),
     r"mask: expected a mask from attnlab.masks"),
    ("structured mask batch", dict(mask=masks.padding(key_lengths=[1, 2, 3])),
     r"mask: .* covers \(Bm, Hm, L, S\) = \(3, 1, 7, 7\)"),
    ("document length", dict(mask=masks.document([0, 1])), r"segment_ids: .*L = 7"),
    ("is_causal type", dict(is_causal="yes"), r"is_causal: expected a bool"),
]


@pytest.mark.parametrize("name,kw,match", CASES, ids=[c[0] for c in CASES])
def test_bad_input_names_argument(name, kw, match):
    args = dict(query=Q, key=K, value=V) | kw
    with pytest.raises(AttnlabError, match=match) as info:
        attnlab.attention(**args)
    assert isinstance(info.value, ValueError)


def test_mixed_devices_named():
    meta = torch.empty(2, 4, 7, 64, device="meta")
    with pytest.raises(AttnlabError, match=r"expected one device, got cpu, meta, cpu"):
        attnlab.attention(Q, meta, V)


def test_reference_backend_refuses_gradients():
    q = Q.clone().requires_grad_()
    with pytest.raises(AttnlabError, match="no gradients"):
        attnlab.attention(q, K, V, backend="reference")


def test_trace_errors():
    with pytest.raises(AttnlabError, match=r"key: expected head dim D = 2"):
        attnlab.trace([[1, 2]], [[1, 2, 3]], [[1, 2, 3]])
    with pytest.raises(AttnlabError, match=r"tokens: expected 1 labels"):
        attnlab.trace([[1, 2]], [[1, 2]], [[1, 2]], tokens=["a", "b"])
    with pytest.raises(AttnlabError, match=r"query: expected numbers"):
        attnlab.trace([["a", "b"]], [[1, 2]], [[1, 2]])


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "3", None])
def test_check_positive_int_names_the_parameter(value):
    from attnlab.errors import check_positive_int

    with pytest.raises(AttnlabError, match=r"^max_length: expected a positive int, got "):
        check_positive_int("max_length", value)
    assert check_positive_int("max_length", 7) == 7
