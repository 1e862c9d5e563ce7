"""The web app over HTTP (no browser): routes, validation, headers, models kept loaded."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from attnlab.viz.app import MAX_BODY, Models, make_server
from viz.fakes import XSS, FakeModels, fake_tokenize


@pytest.fixture(scope="module")
def app():
    fakes = FakeModels()
    models = Models({"default": None, "other": "/models/other"}, load=fakes.load, run=fakes.run)
    server = make_server(models, "127.0.0.1", 0, max_chars=200, max_tokens=20)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", fakes
    server.shutdown()
    server.server_close()


def _call(url, body=None, headers=None, raw=None):
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers or {},
                                 method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_page_and_models(app):
    base, _ = app
    status, headers, body = _call(base + "/")
    assert status == 200 and b'data-mode="app"' in body
    csp = headers["Content-Security-Policy"]
    assert "connect-src 'self'" in csp and "script-src 'sha256-" in csp
    assert headers["X-Content-Type-Options"] == "nosniff"
    status, _, body = _call(base + "/api/models")
    assert json.loads(body) == {"models": ["default", "other"], "max_chars": 200,
                                "max_tokens": 20}


def test_attention_returns_page_data_and_keeps_models_loaded(app):
    base, fakes = app
    for text in ("the cat sat", "a dog ran far", "it was tired"):
        status, _, body = _call(base + "/api/attention", {"text": text, "model": "default"})
        assert status == 200
        data = json.loads(body)
        assert data["tokens"] == text.split() and data["text"] == text
        assert data["n_layers"] == 2 and data["model"] == "default"
    _call(base + "/api/attention", {"text": "x y", "model": "other"})
    _call(base + "/api/attention", {"text": "x y z", "model": "other"})
    assert fakes.loads == [None, "/models/other"]  # each model loaded once, then kept


def test_xss_text_comes_back_as_data(app):
    base, _ = app
    status, _, body = _call(base + "/api/attention", {"text": f"hi {XSS}"})
    assert status == 200 and json.loads(body)["tokens"] == fake_tokenize(f"hi {XSS}")
    assert json.loads(body)["tokens"][1] == XSS


@pytest.mark.parametrize("body, status, message", [
    ({"text": "hi", "model": "gpt-9"}, 400, "model: unknown model 'gpt-9'"),
    ({"text": "   "}, 400, "text: expected a non-empty sentence"),
    ({"text": 5}, 400, "text: expected a non-empty sentence"),
    ({"text": "x" * 201}, 413, "text: 201 characters, the limit is 200"),
    ({"text": " ".join(["w"] * 21)}, 413, "text: 21 tokens, the limit is 20"),
    ([1, 2], 400, "body: expected a JSON object"),
])
def test_bad_requests_get_4xx_with_message(app, body, status, message):
    base, _ = app
    code, headers, raw = _call(base + "/api/attention", body)
    assert code == status
    assert headers["Content-Type"].startswith("application/json")
    assert json.loads(raw)["error"].startswith(message)


def test_not_json_too_big_unknown_path_and_foreign_host(app):
    base, _ = app
    code, _, raw = _call(base + "/api/attention", raw=b"{nope")
    assert code == 400 and "expected JSON" in json.loads(raw)["error"]
    code, _, _ = _call(base + "/api/attention", raw=b" " * (MAX_BODY + 1))
    assert code == 413
    assert _call(base + "/etc/passwd")[0] == 404
    code, _, raw = _call(base + "/", headers={"Host": "evil.example:80"})
    assert code == 403


def test_models_needs_a_choice():
    from attnlab.errors import AttnlabError

    with pytest.raises(AttnlabError, match="models: expected at least one"):
        Models({})
