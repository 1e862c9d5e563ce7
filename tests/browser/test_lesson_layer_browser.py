"""The explorable page's "heads together" block: W_v, W_o and the residual on the lesson's toy
vectors, every number against the Python oracle (`attnlab.explain.lesson_layer.toy_layer`),
for the page's defaults, for random matrices set through window.attnlabLesson, and after an
edit typed into W_o."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.explain.lesson_layer import toy_layer
from attnlab.viz.lesson_page import write_lesson_page


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    return write_lesson_page(tmp_path_factory.mktemp("lesson") / "lesson.html").as_uri()


def _same(got: dict, want: dict):
    for key in ("x", "concat", "attn_out", "residual", "output"):
        np.testing.assert_allclose(got[key], want[key], atol=1e-12, err_msg=key)
    for g, w in zip(got["heads"], want["heads"], strict=True):
        for key in ("query", "values", "weights", "context"):
            np.testing.assert_allclose(g[key], w[key], atol=1e-12, err_msg=key)


def test_heads_together_match_the_oracle(open_page, url):
    page, watch = open_page(url, allowed=[url])
    page.wait_for_selector("body[data-ready='1']", state="attached")
    _same(page.evaluate("attnlabLesson.get().layer"), toy_layer())
    shown = page.text_content("#layer-block .layer-output")
    want = toy_layer()["output"]
    shown_numbers = shown.split("[")[1].split("]")[0].replace("\u2212", "-").split(", ")
    assert shown.startswith("layer norm = [") and shown_numbers == [f"{x:.3f}" for x in want]

    rng = np.random.default_rng(7)
    wq, wk, wv = (rng.normal(size=(2, 4, 2)).round(3) for _ in range(3))
    wo = rng.normal(size=(4, 4)).round(3)
    got = page.evaluate("p => attnlabLesson.set(p).layer",
                        {"heads": [{"w_q": wq[h].tolist(), "w_k": wk[h].tolist(),
                                    "w_v": wv[h].tolist()} for h in range(2)],
                         "layer": {"w_o": wo.tolist()}})
    _same(got, toy_layer(wq.tolist(), wk.tolist(), wv.tolist(), wo.tolist()))

    # a reader types into W_o: the page recomputes, and still matches the oracle
    cell = page.get_by_label("W_o row 1 creature", exact=True)
    cell.fill("2.5")
    cell.press("Enter")
    wo[0, 0] = 2.5
    _same(page.evaluate("attnlabLesson.get().layer"),
          toy_layer(wq.tolist(), wk.tolist(), wv.tolist(), wo.tolist()))
    assert watch.errors == [] and watch.outside() == []


def test_positions_block_matches_the_oracle(open_page, url):
    from attnlab.explain.lesson_layer import POSITIONS, toy_positions

    page, watch = open_page(url, allowed=[url])
    page.wait_for_selector("body[data-ready='1']", state="attached")

    def same(got, want):
        for key in ("q", "k", "dot", "q_moved", "k_moved", "dot_moved", "plain", "by_distance"):
            np.testing.assert_allclose(got[key], want[key], atol=1e-12, err_msg=key)

    got = page.evaluate("attnlabLesson.get().positions")
    want = toy_positions(**POSITIONS)
    same(got, want)
    # moving both words keeps q·k; it is q against k turned by the distance; not the plain q·k
    assert abs(want["dot"] - want["dot_moved"]) < 1e-12
    assert abs(want["dot"] - want["by_distance"]) < 1e-12 and abs(want["dot"] - 7.0) > 0.1
    got = page.evaluate("p => attnlabLesson.set(p).positions",
                        {"positions": {"i": 3, "j": 9, "shift": 11, "theta": 0.3}})
    same(got, toy_positions(3, 9, 11, 0.3))
    cell = page.get_by_label("position of \u201cit\u201d", exact=True)
    cell.fill("4")
    same(page.evaluate("attnlabLesson.get().positions"), toy_positions(4, 9, 11, 0.3))
    assert "only the distance -5 counts" in page.text_content("#positions-block .positions-moved")
    assert watch.errors == [] and watch.outside() == []
