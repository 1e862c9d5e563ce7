"""Nothing in attnlab depends on torch's default dtype: under `torch.set_default_dtype(float64)`
or float16 the op, the masks, the plan and context-parallel attention give what they give under
the float32 default (exactly for the op and masks, 1e-10 for context parallelism in float64)."""

import pytest
import torch

import attnlab
import attnlab.distributed as cp
from distributed.dtype_cases import DEFAULTS, MASKS, dtype_cases
from distributed.harness import make_mask

CASES = dtype_cases()
KINDS = ("none", *MASKS, "prefix", "not_window", "window_and_doc")
BACKENDS = ("auto", "sdpa", "math", "tiled", "reference")


@pytest.fixture(params=list(DEFAULTS))
def default_dtype(request):
    before = torch.get_default_dtype()
    yield DEFAULTS[request.param]
    torch.set_default_dtype(before)


def _under(dtype, fn):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return fn()
    finally:
        torch.set_default_dtype(before)


@pytest.mark.parametrize("kind", KINDS)
def test_op_and_masks_ignore_the_default_dtype(kind, default_dtype):
    L = 37
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, L, 8, generator=g) for _ in range(3))
    mask, is_causal = make_mask(kind, L)

    def run():
        outs = [attnlab.attention(q, k, v, mask=mask, is_causal=is_causal, backend=b,
                                  return_lse=True) for b in BACKENDS]
        if mask is not None:
            outs.append((mask.to_dense(L, L), mask.tiles(L, L, 4, 8),
                         mask.block(torch.arange(3, 9), torch.arange(L), L, L)))
        return outs

    want, got = run(), _under(default_dtype, run)
    for b, w, x in zip((*BACKENDS, "masks"), want, got):
        for a, e in zip(x, w):
            assert a.dtype == e.dtype and torch.equal(a.nan_to_num(), e.nan_to_num()), b


@pytest.mark.parametrize("layout", ("contiguous", "zigzag", "striped"))
@pytest.mark.parametrize("kind", KINDS)
def test_plan_ignores_the_default_dtype(kind, layout, default_dtype):
    mask, is_causal = make_mask(kind, 300)

    def run():
        return cp.plan(300, 4, 2, 16, 3, mask=mask, is_causal=is_causal, layout=layout, batch=2)

    assert _under(default_dtype, run).estimates == run().estimates


@pytest.fixture(scope="module")
def dtype_results():
    from distributed.dtype_cases import run_dtypes
    from distributed.harness import run_group

    per_rank = run_group(run_dtypes, 2)
    return {cid: [d[cid] for d in per_rank] for cid in per_rank[0]}


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_context_parallel_ignores_the_default_dtype(case, dtype_results):
    for rank, r in enumerate(dtype_results[case["id"]]):
        assert "error" not in r, f"rank {rank}: {r.get('error')}"
        assert r["out"] <= 1e-10 and r["finite_grads"] and r["dtype"] == "torch.float64"
