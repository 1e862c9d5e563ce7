"""Any strides are accepted: every backend gives the contiguous call's output, lse and gradients
for sliced, transposed, expanded (stride 0), permuted and non-contiguous batch/head layouts.

The fused CPU kernel reads the last dim as stride 1 whatever the tensor says; these cases are
where a missing copy at its gate shows as wrong numbers, NaN or reads outside the tensor. The
tiled backend is forced so its fused chunks run (L spans two query blocks)."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.ops import fused_cpu

from helpers import assert_close

B, H, L, S, D = 2, 2, 160, 150, 16


def _layout(kind: str, shape, g: torch.Generator) -> torch.Tensor:
    """A (B, H, N, D) tensor in the given memory layout (values random)."""
    b, h, n, d = shape
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    if kind == "sliced":  # last-dim stride 2
        return r(b, h, n, 2 * d)[..., ::2]
    if kind == "transposed":  # last-dim stride n
        return r(b, h, d, n).transpose(-1, -2)
    if kind == "expanded":  # last-dim stride 0
        return r(b, h, n, 1).expand(b, h, n, d)
    if kind == "permuted":  # stored (B, N, H, D), the layout of a fused qkv projection
        return r(b, n, h, d).transpose(1, 2)
    if kind == "batch_head":  # every other batch element and head of a bigger tensor
        return r(2 * b, 2 * h, n, d)[::2, 1::2]
    raise AssertionError(kind)


LAYOUTS = ["sliced", "transposed", "expanded", "permuted", "batch_head"]
BACKENDS = ["auto", "sdpa", "math", "tiled", "reference"]
MASKS = {
    "none": {},
    "causal": {"is_causal": True},
    "window": {"mask": masks.sliding_window(24)},
    "padding": {"mask": masks.padding(key_lengths=[150, 70], query_lengths=[160, 100])},
    "document": {"mask": masks.document(torch.arange(L) // 50, torch.arange(S) // 47)},
    "bool": {"attn_mask": torch.rand(L, S, generator=torch.Generator().manual_seed(1)) < 0.7},
    "float": {"attn_mask": torch.randn(H, L, S, generator=torch.Generator().manual_seed(2))},
}


def _run(backend, q, k, v, kw, need_grad):
    outs = []
    for return_lse in (False, True):
        r = attnlab.attention(q, k, v, backend=backend, return_lse=return_lse, **kw)
        outs.append(r[0] if return_lse else r)
        if return_lse:
            outs.append(r[1])
    if not need_grad:
        return outs, None
    w = torch.randn(outs[0].shape, generator=torch.Generator().manual_seed(3))
    loss = (outs[0] * w).sum() + (outs[1] * w).sum()
    return outs, torch.autograd.grad(loss, (q, k, v))


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_inputs_equal_contiguous(backend, layout, mask):
    g = torch.Generator().manual_seed(0)
    base = [_layout(layout, (B, H, n, D), g) for n in (L, S, S)]
    need_grad = backend != "reference"
    views = [x.detach().requires_grad_(need_grad) for x in base]  # detach keeps the strides
    assert all(not x.is_contiguous() for x in views)
    contig = [x.detach().contiguous().requires_grad_(need_grad) for x in views]
    kw = MASKS[mask]
    got, got_g = _run(backend, *views, kw, need_grad)
    want, want_g = _run(backend, *contig, kw, need_grad)
    for name, a, b in zip(("out", "out (with lse)", "lse"), got, want):
        assert_close(a, b, atol=2e-5, rtol=1e-5, what=f"{backend} {layout} {mask} {name}")
    if need_grad:
        for name, a, b in zip("qkv", got_g, want_g):
            assert_close(a, b, atol=5e-5, rtol=1e-4, what=f"{backend} {layout} {mask} d{name}")


def test_tiled_really_runs_fused_chunks_here():
    """The tiled cases above exercise the fused kernel (else they would not test its gate)."""
    from attnlab.ops.api import make_problem

    q = torch.randn(B, H, L, D)
    p = make_problem(q, q, q, None, 0.0, False, None, False, mask=masks.sliding_window(24))
    assert fused_cpu.applies(p)


@pytest.mark.parametrize("kind", LAYOUTS)
def test_gate_copies_only_what_the_kernel_misreads(kind):
    x = _layout(kind, (B, H, L, D), torch.Generator().manual_seed(0))
    y = fused_cpu.laid_out(x)
    if kind in ("sliced", "transposed", "expanded"):
        assert y.stride(-1) == 1 and y.data_ptr() != x.data_ptr()
    else:  # other strides the kernel honours: no copy
        assert y is x
    assert torch.equal(x, y)


def test_examples_from_the_field():
    """The three reported cases: sliced window, transposed with lse, expanded last dim."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 1024, 64, generator=g)[..., ::2]
    k, v = torch.randn(2, 1, 2, 1024, 32, generator=g)
    w = masks.sliding_window(128)
    assert_close(attnlab.attention(q, k, v, mask=w, backend="tiled"),
                 attnlab.attention(q.contiguous(), k, v, mask=w, backend="tiled"), atol=1e-5)
    q = torch.randn(1, 4, 16, 64, generator=g).transpose(-1, -2)  # (1, 4, 64, 16)
    k, v = torch.randn(2, 1, 4, 64, 16, generator=g)
    o, lse = attnlab.attention(q, k, v, return_lse=True, backend="sdpa")
    oc, lsec = attnlab.attention(q.contiguous(), k, v, return_lse=True, backend="sdpa")
    assert_close(o, oc, atol=1e-5)
    assert_close(lse, lsec, atol=1e-5)
    q = torch.randn(1, 1, 8, 1, generator=g).expand(1, 1, 8, 64)
    k, v = torch.randn(2, 1, 1, 8, 64, generator=g)
    o, lse = attnlab.attention(q, k, v, return_lse=True, backend="sdpa")
    oc, lsec = attnlab.attention(q.contiguous(), k, v, return_lse=True, backend="sdpa")
    assert_close(o, oc, atol=1e-5)
    assert_close(lse, lsec, atol=1e-5)
