"""backend="flex" on CPU: torch's FlexAttention with attnlab's BlockMask and modifiers, exact
against the math backend. The quick tests run torch's eager Flex (ATTNLAB_FLEX_COMPILE=0: the same
BlockMask, mask_mod and score_mod, unfused); two slow tests run the compiled kernel, whose first
compile takes minutes on a busy CPU."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import AttnlabError, masks

DOCS = torch.arange(300) // 70


def periodic(b, h, q, k):
    return (q - k) % 5 != 2


def rel(s, b, h, q, k):
    return s - 0.02 * (q - k).abs() * (h + 1)


CASES = {
    "none": {},
    "causal": {"is_causal": True},
    "causal_br": {"mask": masks.causal("bottom_right")},
    "window": {"mask": masks.window(40, 7, "bottom_right")},
    "documents": {"mask": masks.causal() & masks.document(DOCS[:257], DOCS[:300])},
    "ragged": {"mask": masks.ragged_causal([257, 100], [300, 170])
               & masks.padding(key_lengths=[300, 170], query_lengths=[257, 100])},
    "block_causal": {"mask": masks.block_causal([100, 157], [180, 120], "bottom_right")},
    "function": {"mask": masks.from_function(periodic)},
    "function_and": {"mask": masks.from_function(periodic) & masks.sliding_window(90)},
    "score_mod": {"score_mod": rel, "mask": masks.causal("bottom_right")},
    "alibi": {"score_mod": masks.alibi(torch.rand(2, 4, dtype=torch.float64), symmetric=True,
                                       align="bottom_right")},
    "softcap_float_mask": {"softcap": 4.0, "attn_mask": torch.randn(257, 300,
                                                                    dtype=torch.float64)},
    "bool_mask": {"attn_mask": torch.rand(2, 1, 257, 300) > 0.4},
}


@pytest.fixture
def eager(monkeypatch):
    monkeypatch.setenv("ATTNLAB_FLEX_COMPILE", "0")


def qkv(L=257, S=300, H=4, Hkv=2, D=16, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, L, D, generator=g, dtype=dtype)
    return q, *(torch.randn(2, Hkv, S, D, generator=g, dtype=dtype) for _ in range(2))


@pytest.mark.parametrize("name", list(CASES))
def test_flex_is_exact_on_cpu(eager, name):
    q, k, v = qkv()
    kw = CASES[name]
    want, want_lse = attnlab.attention(q, k, v, backend="math", return_lse=True,
                                       enable_gqa=True, **kw)
    out, lse = attnlab.attention(q, k, v, backend="flex", return_lse=True, enable_gqa=True, **kw)
    assert (out - want).abs().max() < 1e-10
    assert torch.equal(lse.isinf(), want_lse.isinf())
    fin = want_lse.isfinite()
    assert (lse[fin] - want_lse[fin].float()).abs().max() < 1e-5  # Flex's lse is float32


def test_flex_on_cpu_has_no_backward_and_no_dropout(eager):
    q, k, v = (t.requires_grad_(True) for t in qkv(Hkv=4))
    with pytest.raises(AttnlabError, match="tiled"):
        attnlab.attention(q, k, v, backend="flex", is_causal=True)
    with torch.no_grad(), pytest.raises(AttnlabError, match="dropout"):
        attnlab.attention(q, k, v, backend="flex", dropout_p=0.1)


def test_auto_never_picks_flex_on_cpu():
    q, k, v = qkv(Hkv=4)
    for kw in CASES.values():
        assert attnlab.select_backend(q, k, v, **kw).backend != "flex"


def test_nan_policy_on_flex(eager):
    q, k, v = qkv(Hkv=4)
    k[1, 2, 33, 0] = float("nan")
    m = masks.sliding_window(20)
    want = attnlab.attention(q, k, v, backend="math", mask=m)
    out = attnlab.attention(q, k, v, backend="flex", mask=m)
    assert torch.equal(out.isnan(), want.isnan()) and out.isnan().any()


@pytest.mark.slow
def test_compiled_flex_on_cpu_mask_function_and_score_mod():
    """torch.compile'd Flex (forward; CPU compiles inference only)."""
    q, k, v = qkv(L=200, S=256, H=2, Hkv=2, D=16, dtype=torch.float32)
    m = masks.from_function(periodic) & masks.causal("bottom_right")
    want = attnlab.attention(q, k, v, backend="math", mask=m, score_mod=rel)
    out = attnlab.attention(q, k, v, backend="flex", mask=m, score_mod=rel)
    assert (out - want).abs().max() < 1e-5


@pytest.mark.slow
def test_compiled_flex_on_cpu_builtin_mask():
    q, k, v = qkv(L=200, S=256, H=2, Hkv=2, D=16, dtype=torch.float32)
    m = masks.window(30, 5, "bottom_right")
    want = attnlab.attention(q, k, v, backend="math", mask=m)
    out = attnlab.attention(q, k, v, backend="flex", mask=m)
    assert (out - want).abs().max() < 1e-5


# -- issue 35: flex against the other backends --------------------------------------------------


def test_per_batch_padding_on_flex(eager):
    """Item 11: per-batch key lengths with no query lengths (each indexed on its own)."""
    q, k, v = qkv(L=40, S=40, Hkv=4)
    for m in (masks.padding(key_lengths=[40, 25]), masks.padding(query_lengths=[40, 17]),
              masks.padding(key_lengths=31, query_lengths=[40, 17])):
        want = attnlab.attention(q, k, v, mask=m, backend="math")
        out = attnlab.attention(q, k, v, mask=m, backend="flex")
        assert (out - want).abs().max() < 1e-10, m


def test_lse_of_a_finfo_min_row_on_flex(eager):
    """Item 7: a row whose float mask is finfo.min everywhere (HF's padding) has the other
    backends' lse (-3.4e38) and output, not -inf."""
    q, k, v = (t.float() for t in qkv(L=8, S=8, Hkv=4))
    bias = torch.zeros(8, 8)
    bias[3] = torch.finfo(torch.float32).min
    bias[5, :4] = torch.finfo(torch.float32).min
    want, want_lse = attnlab.attention(q, k, v, attn_mask=bias, backend="math", return_lse=True)
    out, lse = attnlab.attention(q, k, v, attn_mask=bias, backend="flex", return_lse=True)
    assert lse.isfinite().all()
    assert torch.equal(lse[..., 3], want_lse[..., 3])  # -3.4e38 + log(8) rounds to -3.4e38
    assert ((lse - want_lse).abs() <= 1e-6 * want_lse.abs() + 1e-5).all()
    assert (out - want).abs().max() < 1e-6


def test_bf16_score_mod_casting_a_table_on_flex(eager):
    """Item 7: a score_mod casting a captured table with .to(score.dtype) sees float32 scores on
    flex as on every other backend, so its lse is theirs."""
    g = torch.Generator().manual_seed(3)
    table = torch.randn(64, generator=g) * 3

    def mod(s, b, h, q, k):
        return s + table[(q - k).abs()].to(s.dtype)

    q, k, v = (t.bfloat16() for t in qkv(L=32, S=32, Hkv=4))
    want, want_lse = attnlab.attention(q, k, v, score_mod=mod, backend="math", return_lse=True)
    out, lse = attnlab.attention(q, k, v, score_mod=mod, backend="flex", return_lse=True)
    assert (lse - want_lse).abs().max() < 1e-3
    assert (out.float() - want.float()).abs().max() < 3e-2  # bf16 outputs: a few ulps


@pytest.mark.parametrize("ret", [lambda s, b, h, q, k: s > 0, lambda s, b, h, q, k: s.long(),
                                 lambda s, b, h, q, k: 1.0, lambda s, b, h, q, k: None,
                                 lambda s, b, h, q, k: s + torch.zeros(3)[q + 10]],
                         ids=["bool", "int", "float", "none", "raises"])
def test_flex_score_mod_returns_are_checked(eager, ret):
    """Item 11: int/bool returns are not accepted, and other bad ones raise one AttnlabError."""
    q, k, v = qkv(L=8, S=8, Hkv=4)
    with pytest.raises(AttnlabError, match="score_mod"):
        attnlab.attention(q, k, v, backend="flex", score_mod=ret)


@pytest.mark.slow
def test_compiled_flex_on_cpu_with_the_issue_35_paths():
    """torch.compile'd Flex through the checked score_mod, the finfo.min row shift and per-batch
    padding's own mask_mod (the wrappers must trace)."""
    q, k, v = qkv(L=200, S=256, H=2, Hkv=2, D=16, dtype=torch.float32)
    table = torch.randn(512, generator=torch.Generator().manual_seed(1))

    def mod(s, b, h, qi, ki):
        return s + table[(qi - ki).abs()].to(s.dtype)

    bias = torch.zeros(200, 256)
    bias[7] = torch.finfo(torch.float32).min
    kw = dict(mask=masks.padding(key_lengths=[256, 170]), score_mod=mod, attn_mask=bias)
    want = attnlab.attention(q, k, v, backend="math", **kw)
    out = attnlab.attention(q, k, v, backend="flex", **kw)
    assert (out - want).abs().max() < 1e-5
