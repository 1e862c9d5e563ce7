"""The web app under hostile or odd clients: nesting, silence, floods, HEAD, IPv6."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time

import pytest

from attnlab.viz.app import Models, make_server
from viz.fakes import FakeModels


def _serve(host="127.0.0.1", **kw):
    fakes = FakeModels()
    models = Models({"default": None}, load=fakes.load, run=fakes.run)
    server = make_server(models, host, 0, **kw)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server


@pytest.fixture
def served(request):
    servers = []

    def start(host="127.0.0.1", **kw):
        servers.append(_serve(host, **kw))
        return servers[-1]

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def _request(server, method, path, body=None, host="127.0.0.1"):
    conn = http.client.HTTPConnection(host, server.server_port, timeout=10)
    try:
        conn.request(method, path, body=body,
                     headers={"Content-Type": "application/json"} if body else {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_deeply_nested_json_is_a_400_not_a_500(served, caplog):
    server = served()
    body = b"[" * 8_000 + b"]" * 8_000  # within the body limit
    with caplog.at_level(logging.ERROR):
        status, _, raw = _request(server, "POST", "/api/attention", body)
    assert status == 400
    assert json.loads(raw)["error"].startswith("body: JSON nested too deeply")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_head_answers_like_get_without_a_body(served):
    server = served()
    for path in ("/", "/api/models", "/nope"):
        g_status, g_headers, g_body = _request(server, "GET", path)
        h_status, h_headers, h_body = _request(server, "HEAD", path)
        assert h_status == g_status != 501
        assert h_body == b""
        assert h_headers["Content-Length"] == g_headers["Content-Length"] == str(len(g_body))
        assert h_headers["Content-Type"] == g_headers["Content-Type"]


def _wait_closed(sock: socket.socket, limit: float) -> float:
    """Seconds until the server closes `sock` (recv returns b''), or `limit` if it does not."""
    start = time.monotonic()
    sock.settimeout(limit)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return limit
    return time.monotonic() - start


def test_a_silent_connection_is_closed_after_the_timeout(served):
    server = served(timeout=0.5)
    with socket.create_connection(("127.0.0.1", server.server_port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1")  # half a request, then silence
        assert _wait_closed(s, 5.0) < 4.0


def test_a_body_that_never_arrives_gets_408(served):
    server = served(timeout=0.5)
    with socket.create_connection(("127.0.0.1", server.server_port)) as s:
        s.sendall(f"POST /api/attention HTTP/1.1\r\nHost: 127.0.0.1:{server.server_port}\r\n"
                  "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode())
        s.settimeout(5)
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.0 408") or reply.startswith(b"HTTP/1.1 408")
    assert b"body: not received within 0.5 s" in reply


def test_idle_connections_are_capped_and_do_not_make_threads(served):
    server = served(max_connections=4, timeout=30)
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", server.server_port)) for _ in range(40)]
    try:
        for s in idle:
            s.sendall(b"GET / HTTP/1.1\r\n")  # never finished
        time.sleep(0.5)
        assert threading.active_count() - before <= 4
        # the refused ones got a 503 and were closed
        refused = 0
        for s in idle[4:]:
            s.settimeout(5)
            data = s.recv(4096)
            refused += data.startswith(b"HTTP/1.1 503")
        assert refused == 36
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the slots come back once the idle ones hang up
        status, _, _ = _request(server, "GET", "/api/models")
        if status == 200:
            break
        time.sleep(0.1)
    assert status == 200


def test_a_client_hanging_up_leaves_no_traceback(served, caplog, capfd):
    server = served()
    with caplog.at_level(logging.INFO):
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", server.server_port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % server.server_port)
            s.close()  # RST before the page is written
        assert _request(server, "GET", "/api/models")[0] == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "Traceback" not in capfd.readouterr().err


def test_ipv6_loopback(served):
    try:
        server = served("::1")
    except OSError as e:  # pragma: no cover - a machine without IPv6
        pytest.fail(f"cannot bind ::1 on this machine: {e}")
    conn = http.client.HTTPConnection("::1", server.server_port, timeout=10)
    conn.request("GET", "/api/models")
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["models"] == ["default"]
    conn.close()
    conn = http.client.HTTPConnection("::1", server.server_port, timeout=10)
    conn.request("GET", "/", headers={"Host": "evil.example"})
    assert conn.getresponse().status == 403
    conn.close()
