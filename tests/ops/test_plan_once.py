"""The tiled plan is built once per call: "auto" reads its density and the tiled kernel runs it."""

from __future__ import annotations

import attnlab
from attnlab import masks
from attnlab.ops import dispatch
from attnlab.ops.tiled import plan

from helpers import assert_close, qkv


def test_auto_plans_once_and_runs_that_plan(monkeypatch):
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")  # the PyTorch path's rule (kernel: test_interval_*)
    q, k, v = qkv(1, 1, 1, 1100, 1100, 8)  # L·S above dispatch.SMALL_SCORES: the density decides
    m = masks.sliding_window(64)
    calls = []
    real = plan.tile_classes
    monkeypatch.setattr(plan, "tile_classes", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    assert attnlab.select_backend(q, k, v, mask=m).backend == "tiled"
    calls.clear()
    out = attnlab.attention(q, k, v, mask=m)
    assert len(calls) == 1  # one classification of the tiles for the choice and the kernel
    assert_close(out, attnlab.attention(q, k, v, mask=m, backend="math"), atol=1e-5)


def test_density_is_the_plans(monkeypatch):
    monkeypatch.setenv("ATTNLAB_KERNEL", "0")  # the PyTorch path's rule (kernel: test_interval_*)
    q, k, v = qkv(1, 2, 2, 1100, 1100, 8)
    p = attnlab.ops.api.make_problem(q, k, v, None, 0.0, False, None, False,
                                     mask=masks.sliding_window(64))
    assert dispatch.choose(p, need_lse=False).backend == "tiled"
    (fused,) = {key[1] for key in p.memo if key[0] == "tiled.plan"}
    pl = p.memo[("tiled.plan", fused)]
    nonempty, _ = plan.tile_classes(p, plan.BLOCK_Q, plan.BLOCK_K)
    assert pl.density == float(nonempty.float().mean())
    assert pl is plan.plan_for(p, fused)
    assert not hasattr(pl, "visited") and not hasattr(pl, "block_q")
