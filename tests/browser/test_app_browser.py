"""The local web app in headless Chromium, on a loopback port the test picks: clean load that
only talks to the app, typing a sentence, head picking, hover, export, errors, the XSS sentence."""

from __future__ import annotations

import threading

import pytest

from attnlab.viz.app import Models, make_server
from browser.helpers_browser import check_png, check_svg, export, lines, pct, texts
from viz.fakes import XSS, FakeModels, fake_capture, fake_tokenize


@pytest.fixture(scope="module")
def app():
    fakes = FakeModels()
    models = Models({"tiny": None, "tiny-2": "/m/2"}, load=fakes.load, run=fakes.run)
    server = make_server(models, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", fakes
    server.shutdown()
    server.server_close()


@pytest.fixture
def app_page(clean_page, app):
    base, _ = app
    return clean_page(base + "/", "#drawing .link", "body:not([data-busy])", allowed=[base])


def _ask(page, text, model=None):
    page.fill("#text", text)
    if model:
        page.select_option("#model", model)
    page.click("#ask button[type=submit]")
    page.wait_for_selector("body:not([data-busy])", state="attached")


def test_app_loads_and_draws_the_default_sentence(app_page, app):
    _, _fakes = app
    assert texts(app_page, "#model option") == ["tiny", "tiny-2"]
    default = app_page.input_value("#text")
    assert app_page.inner_text("#title") == default
    assert app_page.locator("#drawing .tok.q").count() == len(fake_tokenize(default))
    # it opens as `attnlab view` does: the head explain ranks first for "it", "it" pinned
    from attnlab.explain.page_payload import opening

    tokens = fake_tokenize(default)
    o = opening(fake_capture(tokens, n_layers=2, n_heads=3, seed=len(tokens)))
    assert o["token"] == tokens.index("it")
    assert app_page.evaluate("[attnlabState.layer, attnlabState.head, attnlabState.pinned]") == [
        o["layer"], o["head"], o["token"]]


def test_typing_picking_hovering(app_page, app):
    _, fakes = app
    text = "a small dog ran to the big red door"
    _ask(app_page, text, "tiny-2")
    ma = fake_capture(fake_tokenize(text), n_layers=2, n_heads=3, seed=len(text.split()))
    app_page.select_option("#layer", "1")
    app_page.select_option("#head", "2")
    assert app_page.get_attribute("#drawing", "data-head") == "2"
    for i, j, opacity in lines(app_page):
        assert opacity == pytest.approx(ma.weights[1, 2, i, j], abs=1e-4)
    app_page.hover(".tok.q[data-index='5']")
    assert texts(app_page, "#drawing .keys .pct")[:6] == [pct(w) for w in ma.weights[1, 2, 5, :6]]
    assert app_page.inner_text("#meta").startswith("/m/2 ")  # the fake names it by path
    assert sorted(set(fakes.loads), key=str) == sorted({None, "/m/2"}, key=str)
    assert len(fakes.loads) == 2  # loaded once each, however many requests


def test_xss_sentence_stays_text_in_the_app(app_page):
    text = f"look {XSS} here"
    _ask(app_page, text)
    assert app_page.inner_text("#title") == text
    assert app_page.evaluate("document.querySelectorAll('img').length") == 0
    assert XSS in texts(app_page, "#drawing .tok title")


def test_errors_show_as_messages(app_page, app):
    _base, _ = app
    status, body = app_page.evaluate(
        """async () => { const r = await fetch('api/attention', {method: 'POST',
             headers: {'Content-Type': 'application/json'},
             body: JSON.stringify({text: 'hi', model: 'nope'})});
           return [r.status, await r.json()]; }""")
    assert status == 400 and body["error"].startswith("model: unknown model 'nope'")
    app_page.evaluate("""() => { const o = document.createElement('option');
        o.value = o.textContent = '<b>nope</b>'; document.getElementById('model').append(o); }""")
    _ask(app_page, "hi there", "<b>nope</b>")
    assert app_page.inner_text("#error").startswith("model: unknown model '<b>nope</b>'")
    assert app_page.evaluate("document.querySelectorAll('#error b').length") == 0
    app_page.evaluate("document.getElementById('text').removeAttribute('maxlength')")
    _ask(app_page, "x" * 1001)
    assert "1001 characters, the limit is 1000" in app_page.inner_text("#error")
    errors = app_page.attnlab_watch.errors

    def refused():
        return [e for e in errors if "status of 400" in e or "status of 413" in e]

    for _ in range(40):  # console events arrive asynchronously
        if len(refused()) >= 3:
            break
        app_page.wait_for_timeout(50)
    expected = refused()
    assert len(expected) == 3  # Chromium logs each refused request; anything else is a bug
    errors[:] = [e for e in errors if e not in expected]


def test_export_from_the_app(app_page):
    app_page.click(".tab[data-view=step]")
    _, png = export(app_page, "#export-png")
    check_png(png, min_width=2 * int(app_page.get_attribute("#drawing", "width")))
    _, svg = export(app_page, "#export-svg")
    check_svg(svg, ["key", "4 softmax"])
