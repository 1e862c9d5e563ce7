"""Across P = 1-4 gloo processes, context-parallel attention equals single-process attnlab:
fp64 out, lse, dq, dk, dv within 1e-10 relative, for every layout x strategy x mask kind, GQA,
MQA, D = 64, L not divisible by P, L < P; fp32 and bf16 under FlashAttention's rule."""

import pytest

from distributed.cases import exact_cases

from helpers import SLACK

CASES = exact_cases()
FP64 = [c for c in CASES if c["dtype"] == "fp64"]
LOW = [c for c in CASES if c["dtype"] != "fp64"]


def _params(cases):
    return [pytest.param(c, id=c["id"], marks=[pytest.mark.slow] if c["slow"] else [])
            for c in cases]


def _results(c, request):
    fixture = "cp_results_slow" if c["slow"] else "cp_results"
    return request.getfixturevalue(fixture)[c["id"]]


@pytest.mark.parametrize("case", _params(FP64))
def test_fp64_matches_one_process(case, request):
    per_rank = _results(case, request)
    assert len(per_rank) == case["P"]
    assert sum(r["rows"] for r in per_rank) == case["L"]
    for rank, r in enumerate(per_rank):
        for what in ("out", "lse", "dq", "dk", "dv"):
            assert r[what] <= 1e-10, f"rank {rank} {what}: relative error {r[what]:.3e}"


@pytest.mark.parametrize("case", _params([c for c in CASES if c["nan"]]))
def test_nan_in_masked_keys_never_leaks(case, request):
    for r in _results(case, request):
        assert r["finite"]


@pytest.mark.parametrize("case", _params(LOW))
def test_low_precision_flash_attention_rule(case, request):
    import torch

    slack = SLACK[torch.float32 if case["dtype"] == "fp32" else torch.bfloat16]
    for rank, r in enumerate(_results(case, request)):
        for what, factor in (("out", 2), ("dq", 3), ("dk", 3), ("dv", 3)):
            err, plain = r[f"err_{what}"], r[f"plain_{what}"]
            assert err <= factor * plain + slack, (
                f"rank {rank} {what}: error {err:.3e} > {factor} x plain {plain:.3e}")
