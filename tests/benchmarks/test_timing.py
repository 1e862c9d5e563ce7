"""attnlab.bench.timing, the benchmark scripts' one timer, on a clock the test moves (nothing
here is timed)."""

from __future__ import annotations

from attnlab.bench.timing import interleaved_medians


def test_a_steps_before_runs_untimed_right_before_it():
    now, order = [0.0], []

    def step(name):
        def run():
            order.append(name)
            now[0] += 1.0
        return run

    def wait():
        order.append("wait")
        now[0] += 100.0

    got = interleaved_medians({"a": step("a"), "b": step("b")}, 3, warmup=0,
                              clock=lambda: now[0], before={"b": wait})
    assert got == {"a": 1.0, "b": 1.0}
    assert order == ["a", "wait", "b"] * 3
