"""The local web app behind `attnlab serve`: type a sentence, see the same views as the page.

Standard library only (http.server). Three routes: `GET /` (the page in app mode), `GET
/api/models`, `POST /api/attention` with JSON {"text", "model"} -> the page's data; HEAD answers
what GET would, without the body. Models are
loaded once, on first use, and kept; runs are serialised by a lock (torch already uses every core).

Caution: a tool for one person on their own machine. It binds to loopback by default, checks the
Host header (so a web page elsewhere cannot reach it through DNS rebinding), caps request and text
sizes, gives each request `timeout` seconds to arrive whole (line, headers and body), serves at
most `max_connections` at once while keeping room for new ones (app_server.py), and only runs the
models it was started with; it has no authentication and no TLS.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler

from attnlab.errors import AttnlabError
from attnlab.viz.app_server import (
    MAX_CHARS,
    MAX_CONNECTIONS,
    MAX_TOKENS,
    TIMEOUT,
    AppServer,
    DeadlineHandler,
)
from attnlab.viz.lesson_page import lesson_csp, lesson_html
from attnlab.viz.page import csp, page_html
from attnlab.viz.payload import payload

log = logging.getLogger(__name__)

MAX_BODY = 16 * 1024  # bytes of a request body


class RequestError(Exception):
    """A request the app refuses: HTTP status and a one-line message for the page."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


class Models:
    """The models the app may run, by display name -> path (None = the packaged default).

    `load(path)` and `run(text, loaded)` default to attnlab.explain.model; tests pass fakes.
    """

    def __init__(self, choices: dict[str, str | None], load: Callable | None = None,
                 run: Callable | None = None):
        if not choices:
            raise AttnlabError("models: expected at least one model to serve, got none")
        self.choices = dict(choices)
        self._load, self._run = load, run
        self._loaded: dict[str, object] = {}
        self._lock = threading.RLock()
        self.loads = 0  # how many times a model was loaded (each name once)

    @property
    def names(self) -> list[str]:
        return list(self.choices)

    def get(self, name: str):
        if name not in self.choices:
            raise RequestError(HTTPStatus.BAD_REQUEST,
                               f"model: unknown model {name!r}; this app serves {self.names}")
        with self._lock:
            if name not in self._loaded:
                load = self._load
                if load is None:
                    from attnlab.explain.model import load_model as load
                self._loaded[name] = load(self.choices[name])
                self.loads += 1
            return self._loaded[name]

    def run(self, name: str, text: str):
        with self._lock:
            loaded = self.get(name)
            run = self._run
            if run is None:
                from attnlab.explain.model import run_model as run
            return run(text, loaded)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _parse(body: bytes, models: Models, max_chars: int) -> tuple[str, str]:
    try:
        req = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise RequestError(HTTPStatus.BAD_REQUEST, "body: expected JSON like "
                           '{"text": "...", "model": "..."}') from None
    except RecursionError:
        raise RequestError(HTTPStatus.BAD_REQUEST, "body: JSON nested too deeply; expected "
                           '{"text": "...", "model": "..."}') from None
    if not isinstance(req, dict):
        raise RequestError(HTTPStatus.BAD_REQUEST, "body: expected a JSON object")
    text, model = req.get("text"), req.get("model") or models.names[0]
    if not isinstance(text, str) or not text.strip():
        raise RequestError(HTTPStatus.BAD_REQUEST, "text: expected a non-empty sentence")
    if len(text) > max_chars:
        raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                           f"text: {len(text)} characters, the limit is {max_chars}")
    if not isinstance(model, str):
        raise RequestError(HTTPStatus.BAD_REQUEST, f"model: expected a name, got {model!r}")
    for name, value in (("text", text), ("model", model)):
        try:  # JSON's \ud800 escapes decode to lone surrogates, which no UTF-8 text holds
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"{name}: not valid Unicode (a lone "
                               f"surrogate {value[e.start]!r} at character {e.start})") from None
    return text, model


def make_handler(models: Models, *, max_chars: int = MAX_CHARS, max_tokens: int = MAX_TOKENS,
                 allowed_hosts: set[str] | None = None, timeout: float = TIMEOUT):
    page = page_html(app=True).encode("utf-8")
    policy = csp(app=True)
    lesson, lesson_policy = lesson_html().encode("utf-8"), lesson_csp()  # GET /lesson
    timeout_s = timeout

    class Handler(DeadlineHandler):
        server_version = "attnlab"
        sys_version = ""
        timeout = timeout_s  # for a request's line, headers and body together; for each write

        def log_message(self, format, *args):
            log.info("%s %s", self.address_string(), format % args)

        def _send(self, status, body: bytes, ctype: str, policy: str = policy):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", policy)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status, obj):
            self._send(status, json.dumps(obj, allow_nan=False).encode("utf-8"),
                       "application/json; charset=utf-8")

        def _host_ok(self) -> bool:
            if allowed_hosts is None:
                return True
            if (self.headers.get("Host") or "").lower() in allowed_hosts:
                return True
            self._json(HTTPStatus.FORBIDDEN, {"error": "Host: not this app's address"})
            return False

        def do_GET(self):
            self.request_arrived()
            if not self._host_ok():
                return
            path = self.path.split("?", 1)[0]
            if path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, page, "text/html; charset=utf-8")
            elif path == "/lesson":
                self._send(HTTPStatus.OK, lesson, "text/html; charset=utf-8", lesson_policy)
            elif path == "/api/models":
                self._json(HTTPStatus.OK, {"models": models.names, "max_chars": max_chars,
                                           "max_tokens": max_tokens})
            else:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {path[:80]}"})

        do_HEAD = do_GET

        def do_POST(self):
            if not self._host_ok():
                return
            try:
                if self.path.split("?", 1)[0] != "/api/attention":
                    raise RequestError(HTTPStatus.NOT_FOUND, "POST goes to /api/attention")
                self._json(HTTPStatus.OK, self._attention())
            except RequestError as e:
                self._json(e.status, {"error": str(e)})
            except AttnlabError as e:  # the model refused the text (too long for it, ...)
                self._json(HTTPStatus.BAD_REQUEST, {"error": str(e)})
            except TimeoutError:  # the body did not arrive in time
                self.close_connection = True
                self.request_arrived()  # the 408 gets a write timeout of its own
                self._json(HTTPStatus.REQUEST_TIMEOUT,
                           {"error": f"body: not received within {self.timeout:g} s"})
            except ConnectionError:  # the client hung up: the server logs one line
                self.close_connection = True
                raise
            except Exception:
                log.exception("attention request failed")
                self._json(HTTPStatus.INTERNAL_SERVER_ERROR,
                           {"error": "internal error while running the model (see the server)"})

        def _attention(self) -> dict:
            try:
                n = int(self.headers.get("Content-Length") or -1)
            except ValueError:
                n = -1
            if n < 0:
                raise RequestError(HTTPStatus.LENGTH_REQUIRED, "Content-Length: required")
            if n > MAX_BODY:
                raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                   f"body: {n} bytes, the limit is {MAX_BODY}")
            body = self.rfile.read(n)
            self.request_arrived()
            text, model = _parse(body, models, max_chars)
            ma = models.run(model, text)
            if len(ma.tokens) > max_tokens:
                raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                   f"text: {len(ma.tokens)} tokens, the limit is {max_tokens}; "
                                   "shorten the text")
            return payload(ma, text)

    return Handler


def make_server(models: Models, host: str = "127.0.0.1", port: int = 8000, *,
                max_chars: int = MAX_CHARS, max_tokens: int = MAX_TOKENS,
                timeout: float = TIMEOUT, max_connections: int = MAX_CONNECTIONS) -> AppServer:
    """A ready server (not yet serving); port 0 picks a free port (see `server.server_port`).

    `host` may be IPv4 or IPv6 (`"::1"`); `timeout` is the seconds a request may take to
    arrive (line, headers and body together); at most `max_connections` are served at once: a
    new connection takes the slot of the one waiting longest for its request, and gets a 503
    only when every slot is running a request.
    """
    server = AppServer((host, port), BaseHTTPRequestHandler, max_connections=max_connections)
    allowed = None
    if is_loopback(host):
        p = server.server_port
        name = f"[{host.lower()}]" if ":" in host else host.lower()
        allowed = {f"{h}:{p}" for h in ("127.0.0.1", "localhost", "[::1]", name)}
    server.RequestHandlerClass = make_handler(models, max_chars=max_chars, max_tokens=max_tokens,
                                              allowed_hosts=allowed, timeout=timeout)
    return server
