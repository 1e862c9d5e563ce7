"""The explorable lesson page in headless Chromium: a clean offline load, the lesson's numbers on
arrival, a query dragged with real mouse events, the page's arithmetic equal to attnlab.trace on
random vectors (1e-9), keyboard-only use, garbage typed into a field, and a screenshot per section.

Set ATTNLAB_SCREENSHOTS=docs/img to write the README's screenshots while the tests run."""

from __future__ import annotations

import functools
import io
import os
import re
import threading
from pathlib import Path

import numpy as np
import pytest

from attnlab.explain.lesson_sections import build_lesson
from attnlab.masks import causal
from attnlab.tracing import trace
from attnlab.viz.app import Models, make_server
from attnlab.viz.lesson_page import write_lesson_page
from browser.helpers_browser import texts
from viz.fakes import FakeModels

from helpers import close

Q, IT = "\u201c{}\u201d", "\u201cit\u201d"
SECTIONS = ["compare", "normalize", "scale", "borrow", "mask", "heads", "check"]
ATOL = 1e-9


@pytest.fixture(scope="module")
def page_url(tmp_path_factory):
    path = tmp_path_factory.mktemp("lesson") / "lesson.html"
    write_lesson_page(path)
    return path.as_uri()


@pytest.fixture
def page(clean_page, page_url):
    return clean_page(page_url, "body[data-ready]")  # nothing but the file itself


def get(page) -> dict:
    return page.evaluate("window.attnlabLesson.get()")


def put(page, partial) -> dict:
    return page.evaluate("p => window.attnlabLesson.set(p)", partial)


close = functools.partial(close, atol=ATOL)  # the page's arithmetic against attnlab.trace


def check_main(g):
    """The page's query row against attnlab.trace on the same vectors."""
    t = trace([g["query"]], g["keys"], g["values"], scale=None if g["scaled"] else 1.0)
    assert g["scale"] == pytest.approx(t.scale, abs=1e-15)
    close(g["scores"], t.scores[0])
    close(g["scaled_scores"], t.scaled_scores[0])
    close(g["weights"], t.weights[0])
    close(g["output"], t.output[0])


def number(text: str) -> float:
    return float(text.replace("\u2212", "-").rstrip("%"))


def test_loads_offline_and_every_section_renders(page):
    for s in SECTIONS:
        assert page.locator(f"#{s}").is_visible()
    assert page.locator("#compare-plane .key-arrow").count() == 3
    assert page.locator("#compare-plane .query-arrow").count() == 1
    assert page.locator("#normalize-bars .bar-row").count() == 3
    assert page.locator("#dims-strips circle").count() == 16
    assert page.locator("#borrow-plane .share").count() == 3
    assert page.locator("#mask-grid button").count() == 16
    assert page.locator(".head .bar-row").count() == 16
    assert page.locator("#check .q").count() == len(build_lesson(["check"])[0].questions)


def test_defaults_show_the_lessons_numbers(page):
    assert texts(page, "#compare .dots .score") == ["7", "4", "3"]
    assert texts(page, "#compare .dots .arith") == [
        "2\u00b73 + 1\u00b71 =", "2\u00b70 + 1\u00b74 =", "2\u00b71 + 1\u00b71 ="]
    assert texts(page, "#scale-table .raw-w") == ["93.6%", "4.7%", "1.7%"]
    assert texts(page, "#scale-table .scaled-w") == ["84.8%", "10.2%", "5.0%"]
    assert texts(page, "#normalize-bars .val") == ["125.0%", "\u221250.0%", "25.0%"]
    assert page.inner_text("#borrow-context").endswith("= [0.873, 0.127]")
    assert texts(page, ".head-top") == [f"\u2192 {IT} borrows most from {Q.format('cat')} (98.4%)",
                                        f"\u2192 {IT} borrows most from {Q.format('mat')} (95.1%)"]
    sections = {s.name: s.to_json() for s in build_lesson()}
    g = get(page)
    check_main(g)
    close(g["grid"]["weights"], sections["mask"]["weights"])
    for got, want in zip(g["heads"], sections["heads"]["heads"]):
        close(got["weights"], want["weights"])
    close(g["normalize"]["divided"], sections["normalize"]["divided"])


def test_dragging_the_query_recomputes_like_trace(page):
    box = page.locator('[data-handle="q"]').bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x - 150, y + 60, steps=6)
    page.mouse.up()
    g = get(page)
    assert g["query"] != [2, 1] and g["scores"] != [7, 4, 3]
    assert g["query"][0] < 0  # dragged left of the origin
    check_main(g)
    shown = [number(t) for t in texts(page, "#compare .dots .score")]
    close(shown, np.round(g["scores"], 3))
    page.click("#scaled")  # the same vectors without the 1/sqrt(d)
    g = get(page)
    assert g["scaled"] is False
    check_main(g)
    page.locator('[data-handle="k1"]').scroll_into_view_if_needed()
    box = page.locator('[data-handle="k1"]').bounding_box()  # a key's tip drags too
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + 80, box["y"] + 120, steps=4)
    page.mouse.up()
    g2 = get(page)
    assert g2["keys"][1] != [0, 4] and g2["query"] == g["query"]
    check_main(g2)


def test_dragging_among_random_keys_recomputes_like_trace(page):
    rng = np.random.default_rng(3)
    for S, Dv, scaled in [(2, 1, True), (5, 3, False), (8, 2, True)]:
        put(page, {"query": [1.0, -1.0], "keys": rng.uniform(-4, 4, size=(S, 2)).round(1).tolist(),
                   "values": rng.normal(size=(S, Dv)).tolist(), "scaled": scaled})
        handle = page.locator('[data-handle="q"]')
        handle.scroll_into_view_if_needed()
        box = handle.bounding_box()
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        dx, dy = rng.uniform(-60, 60, size=2)
        page.mouse.move(x, y)
        page.mouse.down()
        page.mouse.move(x + dx, y + dy, steps=3)
        page.mouse.up()
        g = get(page)
        assert g["query"] != [1.0, -1.0]
        check_main(g)


def test_random_vectors_agree_with_trace(page):
    rng = np.random.default_rng(7)
    for S, D, Dv in [(1, 2, 2), (3, 2, 2), (5, 7, 3), (8, 16, 5)]:
        for scaled in (True, False):
            g = put(page, {"query": (3 * rng.normal(size=D)).tolist(),
                           "keys": (3 * rng.normal(size=(S, D))).tolist(),
                           "values": rng.normal(size=(S, Dv)).tolist(), "scaled": scaled})
            assert len(g["tokens"]) == S and g["scaled"] is scaled
            check_main(g)
    for q, k in (([0.5], [[2.0], [-1.0], [0.0]]),  # one number per vector
                 ([0.0, 0.0], [[0.0, 0.0], [1.0, -1.0]]),  # a zero query: equal weights
                 ([1000.0, -1000.0], [[1000.0, 1000.0], [-1000.0, 999.5]])):  # huge scores
        v = [[1.0], [-2.0], [0.5]][:len(k)] if len(q) == 1 else [[1.0, 2.0], [3.0, 4.0]]
        check_main(put(page, {"query": q, "keys": k, "values": v}))
    for L, D in [(1, 1), (4, 3), (8, 6)]:
        for masked in (True, False):
            q, k, v = rng.normal(size=(3, L, D)) * 2
            g = put(page, {"grid": {"queries": q.tolist(), "keys": k.tolist(), "values": v.tolist(),
                                    "causal": masked}})["grid"]
            t = trace(q, k, v, mask=causal() if masked else None)
            close(g["scores"], t.scores)
            close(g["weights"], t.weights)
            close(g["output"], t.output)
    x = np.array(get(page)["heads"][0]["keys"])  # (8, 2) with the lesson's projections
    assert x.shape == (8, 2)
    from attnlab.explain.lesson_sections import EMBEDDINGS, HEAD_TOKENS

    emb = np.array([EMBEDDINGS[t] for t in HEAD_TOKENS])  # (L, 4)
    wq, wk = rng.normal(size=(2, 2, 4, 2))
    g = put(page, {"heads": [{"w_q": wq[0].tolist(), "w_k": wk[0].tolist()},
                             {"w_q": wq[1].tolist(), "w_k": wk[1].tolist()}]})
    for h in range(2):
        t = trace(emb[-1:] @ wq[h], emb @ wk[h], np.eye(8))  # (1, 4) @ (4, 2) -> (1, 2)
        close(g["heads"][h]["scores"], t.scores[0])
        close(g["heads"][h]["weights"], t.weights[0])
    for temperature in (0.3, 1.0, 4.2):
        n = put(page, {"normalize": {"scores": [5.0, -2.0, 1.0, 0.5],
                                     "temperature": temperature}})["normalize"]
        t = trace([[1.0]], [[5.0], [-2.0], [1.0], [0.5]], np.eye(4), scale=1 / temperature)
        close(n["softmax"], t.weights[0])
    for d in (2, 64, 512):
        r = put(page, {"dims": {"d": d, "seed": 3}})["dims"]
        raw = trace([r["query"]], r["keys"], np.eye(8), scale=1.0)
        scaled = trace([r["query"]], r["keys"], np.eye(8))
        close(r["scores"], raw.scores[0])
        close(r["weights_raw"], raw.weights[0])
        close(r["weights_scaled"], scaled.weights[0])


def test_a_touch_moves_the_query(browser, page_url):
    ctx = browser.new_context(has_touch=True, viewport={"width": 800, "height": 900})
    try:
        page = ctx.new_page()
        page.goto(page_url)
        page.wait_for_selector("body[data-ready]", state="attached")
        box = page.locator("#compare-plane").bounding_box()
        unit = box["width"] * (400 - 40) / 10 / 400  # the plane shows -5 ... 5 in 400 px
        cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        page.touchscreen.tap(cx - 2 * unit, cy - 3 * unit)
        g = get(page)
        assert g["query"] == [-2, 3]
        check_main(g)
    finally:
        ctx.close()


@pytest.mark.parametrize("partial, says", [
    ({"keys": [[1, 2, 3]]}, "keys: expected 2 finite numbers"),
    ({"values": [[1, 0]]}, "values: expected 3 rows"),
    ({"query": [1, float("nan")]}, "query: expected finite numbers"),
    ({"dims": {"d": 1000}}, "dims.d: expected an integer 2"),
    ({"keys": [[0, 1]] * 9, "values": [[0]] * 9}, "keys: at most 8 tokens"),
])
def test_set_refuses_bad_input_and_changes_nothing(page, partial, says):
    before = get(page)
    with pytest.raises(Exception, match=re.escape(f"attnlabLesson.set: {says}")):
        put(page, partial)
    assert get(page) == before


def test_the_scale_section_shows_the_effect(page):
    small = put(page, {"dims": {"d": 2, "seed": 1}})["dims"]
    big = put(page, {"dims": {"d": 512, "seed": 1}})["dims"]
    assert big["spread"] > 8 * small["spread"]  # grows like sqrt(d): sqrt(256) = 16
    assert big["spread"] / np.sqrt(512) == pytest.approx(1, abs=0.2)
    assert max(big["weights_raw"]) > 0.99 > max(big["weights_scaled"])
    assert page.inner_text("#dims-value") == "d = 512"
    before = get(page)["dims"]["query"]
    page.click("#reroll")
    assert get(page)["dims"]["query"] != before


def test_keyboard_alone_reaches_every_control(page):
    n = page.evaluate("""() => {
      const all = [...document.querySelectorAll('a[href], button, input, select, [tabindex="0"]')]
        .filter(e => !e.disabled && e.getClientRects().length > 0);
      all.forEach((e, i) => e.setAttribute('data-kb', i));
      window.kbSeen = new Set();
      document.addEventListener('focusin',
                                e => window.kbSeen.add(e.target.getAttribute('data-kb')));
      return all.length;
    }""")
    assert n > 100
    for _ in range(n + 5):
        page.keyboard.press("Tab")
    seen = set(page.evaluate("[...window.kbSeen]"))
    missing = page.evaluate("""seen => [...document.querySelectorAll('[data-kb]')]
      .filter(e => !seen.includes(e.getAttribute('data-kb')))
      .map(e => e.outerHTML.slice(0, 80))""", sorted(s for s in seen if s is not None))
    assert missing == []
    page.focus('[data-handle="q"]')  # arrow keys move a focused handle by 0.1
    for key in ("ArrowRight", "ArrowRight", "ArrowDown"):
        page.keyboard.press(key)
    assert page.evaluate("document.activeElement.dataset.handle") == "q"
    g = get(page)
    assert g["query"] == [2.2, 0.9]
    check_main(g)
    page.focus("#add-token")
    page.keyboard.press("Enter")
    assert len(get(page)["tokens"]) == 4
    page.focus("#scaled")
    page.keyboard.press("Space")
    assert get(page)["scaled"] is False
    page.focus("#mask-grid button[data-i='0'][data-j='2']")
    page.keyboard.press("Enter")
    assert page.inner_text("#mask-why").startswith("Hidden:")


@pytest.mark.parametrize("selector, read", [
    ('#compare-side input[aria-label="key of token 1, number 1"]', lambda g: g["keys"][0][0]),
    ('#compare-side input[aria-label="value of token 2, number 2"]', lambda g: g["values"][1][1]),
    ('#compare-side input[aria-label="query for it, number 2"]', lambda g: g["query"][1]),
    ('#normalize input[aria-label="example score, number 2"]',
     lambda g: g["normalize"]["scores"][1]),
    ('.head[data-head="0"] input[aria-label^="head who? W_q needs a referent column 1"]',
     lambda g: g["heads"][0]["w_q"][3][0]),
])
def test_garbage_keeps_the_last_good_value(page, selector, read):
    field = page.locator(selector)
    good = read(get(page))
    before = get(page)
    for garbage, says in (("abc", "is not a number"), ("1e999", "out of range"),
                          ("", "empty: type a number"), ("2..5", "is not a number")):
        field.fill(garbage)
        msg = field.locator("xpath=following-sibling::span[@class='msg']")
        assert says in msg.inner_text() and "still using" in msg.inner_text()
        assert field.get_attribute("aria-invalid") == "true"
        assert get(page) == before  # nothing moved
    field.fill("\u22122.5")  # a typographic minus is a minus
    assert read(get(page)) == -2.5 != good
    assert field.locator("xpath=following-sibling::span[@class='msg']").inner_text() == ""
    assert field.get_attribute("aria-invalid") is None


def test_tokens_are_added_renamed_and_removed(page):
    for _ in range(5):
        page.click("#add-token")
    g = get(page)
    assert len(g["tokens"]) == 8 and page.is_disabled("#add-token")
    check_main(g)
    name = page.locator('#compare-side input[aria-label="token 4"]')
    name.fill("")
    assert "empty" in name.locator("xpath=following-sibling::span").inner_text()
    name.fill("<b>x</b>")
    assert get(page)["tokens"][3] == "<b>x</b>"
    assert "<b>x</b>" in page.inner_text("#borrow-recipe")  # stays text
    page.click('#compare-side button[aria-label="remove cat"]')
    g = get(page)
    assert len(g["tokens"]) == 7 and "cat" not in g["tokens"]
    check_main(g)


def test_mask_cells_explain_and_causal_switches(page):
    page.click("#mask-grid button[data-i='1'][data-j='3']")
    why = page.inner_text("#mask-why")
    assert why.startswith(f"Hidden: {Q.format('on')} comes after {Q.format('cat')}")
    page.click("#mask-grid button[data-i='2'][data-j='0']")
    why = page.inner_text("#mask-why")
    assert why.startswith(f"Allowed: {Q.format('The')} comes before {Q.format('sat')}")
    masked = get(page)["grid"]["weights"]
    page.click("#causal")
    g = get(page)["grid"]
    assert g["causal"] is False and "hidden" not in texts(page, "#mask-grid button")
    t = trace(g["queries"], g["keys"], g["values"])
    close(g["weights"], t.weights)
    assert g["weights"] != masked
    page.click("#mask-grid button[data-i='0'][data-j='3']")
    why = page.inner_text("#mask-why")
    assert why.startswith(f"No mask: {Q.format('The')} peeks at {Q.format('on')}")


def test_check_yourself_opens_answers_after_a_try(page):
    cards = page.locator("#check .q")
    first = cards.nth(0)
    assert not first.locator(".answer").is_visible()
    first.locator("button[data-right='false']").first.click()
    assert first.locator(".answer").is_visible() and "not quite" in first.inner_text()
    away = page.locator("#check .q", has_text="point in a similar direction")
    assert not away.locator(".answer").is_visible()
    page.focus('[data-handle="q"]')
    for _ in range(25):  # walk the query away from cat [3, 1] with the keyboard
        page.keyboard.press("ArrowLeft")
    assert get(page)["scores"][0] < 0
    assert away.locator(".answer").is_visible() and "\u2713 done" in away.inner_text()
    assert "[2, 1]\u00b7[4, 2] = 10" in away.locator(".answer").inner_text()


def test_a_screenshot_of_every_section(page, tmp_path):
    from PIL import Image

    out = Path(os.environ.get("ATTNLAB_SCREENSHOTS") or tmp_path)
    page.locator("#check .q").first.locator("button[data-right='true']").click()  # one answered
    page.click("#mask-grid button[data-i='1'][data-j='2']")  # one cell explained
    for s in SECTIONS:
        box = page.locator(f"#{s}").bounding_box()  # viewport coordinates -> the page's
        box["y"] += page.evaluate("window.scrollY")
        png = page.screenshot(full_page=True, clip={**box, "height": min(box["height"], 760)})
        img = Image.open(io.BytesIO(png)).convert("RGB")
        assert img.width > 600 and img.height > 150, (s, img.size)
        colours = img.getcolors(maxcolors=1 << 20)
        assert len(colours) > 50, (s, len(colours))  # text and drawings, not a blank box
        (out / f"lesson-{s}.png").write_bytes(png)


def test_served_at_lesson_by_the_app(open_page):
    fakes = FakeModels()
    server = make_server(Models({"tiny": None}, load=fakes.load, run=fakes.run), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        page, watch = open_page(base + "/lesson", allowed=[base + "/lesson"])
        page.wait_for_selector("body[data-ready]", state="attached")
        assert re.match(r"\[0\.873, 0\.127\]", page.inner_text("#borrow-context").split("= ")[1])
        assert watch.errors == [] and watch.outside() == []
    finally:
        server.shutdown()
        server.server_close()
