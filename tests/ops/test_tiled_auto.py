"""backend="auto": the choice is inspectable (attnlab.select_backend), follows the rule in
dispatch.choose, and agrees with every forced backend; new keyword options work everywhere."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.errors import AttnlabError

from helpers import assert_close, backend_names, qkv, spy_backends


def choice(L, S=None, **kw):
    q, k, v = qkv(1, 2, 2, L, S or L, 8)
    return attnlab.select_backend(q, k, v, **kw)


def test_choices(monkeypatch):
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")  # the PyTorch path's rule (kernel: test_interval_*)
    assert choice(600).backend == "sdpa"  # no mask: fused kernel
    assert choice(600, is_causal=True).backend == "sdpa"
    assert choice(64, mask=masks.sliding_window(8)).backend == "sdpa"  # small: dense mask
    assert choice(2048, mask=masks.sliding_window(256)).backend == "tiled"
    assert choice(2048, mask=masks.document(torch.arange(2048) // 256)).backend == "tiled"
    assert choice(2048, mask=masks.padding(key_lengths=[2047])).backend == "sdpa"  # ~all tiles
    assert choice(600, softcap=30.0).backend == "tiled"
    assert choice(600, alibi_slopes=torch.tensor([0.5, 0.25])).backend == "tiled"
    assert choice(0, 5).backend == "math"
    c = choice(2048, mask=masks.causal("bottom_right"))  # square: the top-left causal kernel
    assert c.backend == "sdpa" and "causal" in c.reason
    c = choice(1024, 2048, mask=masks.causal("bottom_right"))
    assert c.backend == "sdpa" and "%" in c.reason  # most tiles kept: dense mask


@pytest.mark.parametrize("name, L, S, kw", [
    ("sdpa", 64, 64, {"mask": masks.sliding_window(8)}),
    ("tiled", 600, 600, {"softcap": 30.0}),
    ("tiled", 2048, 2048, {"mask": masks.sliding_window(64)}),
])
def test_auto_runs_the_backend_select_backend_names(monkeypatch, name, L, S, kw):
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")  # the PyTorch path's rule (kernel: test_interval_*)
    q, k, v = qkv(1, 2, 2, L, S, 8)
    assert attnlab.select_backend(q, k, v, **kw).backend == name
    ran = spy_backends(monkeypatch)
    attnlab.attention(q, k, v, **kw)
    assert ran == [name]


def test_float_mask_needing_grad_goes_to_math():
    q, k, v = qkv(1, 2, 2, 8, 8, 4)
    bias = torch.zeros(8, 8, requires_grad=True)
    assert attnlab.select_backend(q, k, v, attn_mask=bias).backend == "math"


CASES = {
    "window": dict(mask=masks.sliding_window(100)),
    "document": dict(mask=masks.document(torch.arange(700) // 100)),
    "causal_br": dict(mask=masks.causal("bottom_right")),
    "softcap_alibi": dict(is_causal=True, softcap=20.0,
                          alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625])),
}


@pytest.mark.parametrize("name", list(CASES))
def test_auto_agrees_with_forced_backends(name):
    q, k, v = qkv(1, 4, 2, 700, 700, 16, seed=2)
    kw = dict(CASES[name], enable_gqa=True, return_lse=True)
    want, want_lse = attnlab.attention(q, k, v, backend="math", **kw)
    for backend in backend_names(without=("flex", "reference", "math")):
        out, lse = attnlab.attention(q, k, v, backend=backend, **kw)
        assert_close(out, want, atol=2e-5, rtol=1e-4, what=f"{backend} out")
        assert_close(lse, want_lse, atol=2e-5, rtol=1e-5, what=f"{backend} lse")


def test_bad_modifiers_are_rejected():
    q, k, v = qkv(1, 2, 2, 4, 4, 4)
    for bad in (-1.0, 0.0, float("inf"), float("nan"), "big"):
        with pytest.raises(AttnlabError, match="softcap: expected a positive finite number"):
            attnlab.attention(q, k, v, softcap=bad)
    with pytest.raises(AttnlabError, match=r"alibi_slopes: expected a float tensor of shape "
                                           r"\(H,\) = \(2,\), got list$"):
        attnlab.attention(q, k, v, alibi_slopes=[0.5, 0.25])
    with pytest.raises(AttnlabError, match=r"got Tensor torch.int64$"):
        attnlab.attention(q, k, v, alibi_slopes=torch.tensor([1, 2]))
    with pytest.raises(AttnlabError, match=r"alibi_slopes: expected shape \(H,\) = \(2,\)"):
        attnlab.attention(q, k, v, alibi_slopes=torch.ones(3))
    with pytest.raises(AttnlabError, match="reference"):
        attnlab.attention(q, k, v, softcap=5.0, backend="reference")
