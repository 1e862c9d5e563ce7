"""The web app under hostile or odd clients: nesting, silence, floods, HEAD, IPv6."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import select
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
        # the server settles at 4 handler threads; a loaded machine may take a moment to get there
        deadline = time.monotonic() + 10
        while threading.active_count() - before > 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() - before <= 4
        # each newer one took the slot of the one waiting longest: it got a 408 and was closed
        given_way = 0
        for s in idle[:36]:
            s.settimeout(5)
            given_way += s.recv(4096).startswith(b"HTTP/1.1 408")
        assert given_way == 36
    finally:
        for s in idle:
            s.close()
    assert _request(server, "GET", "/api/models")[0] == 200


def _slow_clients(port: int, n: int, every_s: float, stop: threading.Event):
    """`n` connections that send a request line, then one header line every `every_s` seconds
    until `stop` (at most 30 lines); returns the thread that feeds them and the sockets."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET / HTTP/1.1\r\n")
        socks.append(s)

    def feed():
        for i in range(30):
            if stop.wait(every_s):
                return
            for s in socks:
                with contextlib.suppress(OSError):
                    s.sendall(b"X-Slow-%d: 1\r\n" % i)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return thread, socks


def test_slow_header_clients_cannot_keep_out_a_real_request(served):
    server = served()  # the defaults: 32 connections, 10 s per request
    stop = threading.Event()
    thread, socks = _slow_clients(server.server_port, 40, 0.5, stop)
    try:
        for _ in range(3):  # each answered while the 40 keep sending, a line each twice a second
            time.sleep(0.6)
            status, _, raw = _request(server, "GET", "/api/models")
            assert status == 200, raw
    finally:
        stop.set()
        thread.join(10)
        for s in socks:
            s.close()


def test_a_request_dribbling_in_is_cut_at_its_deadline(served):
    server = served(timeout=1.0)
    with socket.create_connection(("127.0.0.1", server.server_port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\n")
        sent = 0
        for i in range(40):  # 10 s of headers at one line every 0.25 s, if the server let it
            time.sleep(0.25)
            try:
                s.sendall(b"X-Slow-%d: 1\r\n" % i)
            except OSError:
                break
            sent += 1
            if select.select([s], [], [], 0)[0]:  # the server answered or closed
                break
    assert sent < 39, "the server kept reading a request past its deadline"


def test_requests_running_keep_their_slots_and_the_next_gets_503(tmp_path):
    fakes, release = FakeModels(), threading.Event()

    def slow_run(text, loaded):
        release.wait(20)
        return fakes.run(text, loaded)

    models = Models({"default": None}, load=fakes.load, run=slow_run)
    server = make_server(models, "127.0.0.1", 0, max_connections=2, timeout=10)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    body = json.dumps({"text": "a b"}).encode()
    results = []
    posts = [threading.Thread(target=lambda: results.append(
        _request(server, "POST", "/api/attention", body)[0])) for _ in range(2)]
    try:
        for t in posts:
            t.start()
        deadline = time.monotonic() + 10
        while fakes.loads == [] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # both requests sent and running (one runs, one waits for the lock)
        status, _, raw = _request(server, "GET", "/api/models")
        assert status == 503 and b"busy" in raw
    finally:
        release.set()
        for t in posts:
            t.join(20)
        server.shutdown()
        server.server_close()
    assert results == [200, 200]


def test_a_lone_surrogate_is_a_400_not_a_500(served, caplog):
    server = served()
    with caplog.at_level(logging.ERROR):
        status, _, raw = _request(server, "POST", "/api/attention",
                                  b'{"text": "a\\ud800b"}')
    assert status == 400, raw
    assert json.loads(raw)["error"] == ("text: not valid Unicode (a lone surrogate '\\ud800' "
                                        "at character 1)")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_client_hanging_up_mid_answer_logs_one_line(caplog, capfd):
    fakes = FakeModels()

    def slow_run(text, loaded):
        time.sleep(0.5)  # the client hangs up meanwhile
        return fakes.run(text, loaded)

    models = Models({"default": None}, load=fakes.load, run=slow_run)
    server = make_server(models, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    body = json.dumps({"text": "a b c"}).encode()
    try:
        with caplog.at_level(logging.INFO):
            s = socket.create_connection(("127.0.0.1", server.server_port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.sendall(b"POST /api/attention HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: "
                      b"%d\r\n\r\n%s" % (server.server_port, len(body), body))
            time.sleep(0.1)
            s.close()  # RST before the answer is written
            deadline = time.monotonic() + 10
            while fakes.runs == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _request(server, "GET", "/api/models")[0] == 200  # after the answer failed
            time.sleep(0.2)
    finally:
        server.shutdown()
        server.server_close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    closed = [r for r in caplog.records if "connection closed" in r.getMessage()]
    assert len(closed) == 1, [r.getMessage() for r in caplog.records]
    assert "Traceback" not in capfd.readouterr().err


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
