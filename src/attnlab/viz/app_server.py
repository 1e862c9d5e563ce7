"""The HTTP server under `attnlab serve`: bounded connections, a deadline per request, IPv4 or
IPv6, and the app's default limits (standard library only: `attnlab serve --help` reads them).

http.server's ThreadingHTTPServer starts one thread per connection and lets a connection sit
forever: a thousand half-sent requests make a thousand threads. Here:

- at most `max_connections` connections are served at once;
- each request has one deadline for its request line, headers and body together (`timeout`
  seconds from its first byte's wait), not a timeout per read that a client sending a byte now
  and then could stretch forever;
- when every slot is taken, a new connection takes the slot of the connection that has waited
  longest for its request to arrive (it gets a 408 and is closed), so clients that send slowly
  cannot keep a real request out; only when every slot is running a request does a new
  connection get a 503;
- a client that hangs up mid-answer is one log line, not a traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

MAX_CHARS = 1000      # characters of text a request may send
MAX_TOKENS = 128      # tokens after the model's tokenizer (the page stays responsive)
MAX_CONNECTIONS = 32  # connections served at once
TIMEOUT = 10.0        # seconds a request's line, headers and body may take, all together


def _response(status: str, message: str, extra: str = "") -> bytes:
    body = json.dumps({"error": message}).encode()
    head = (f"HTTP/1.1 {status}\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n")
    return head.encode("ascii") + body


_BUSY = _response("503 Service Unavailable", "busy: too many requests running, try again",
                  "Retry-After: 1\r\n")
_EVICTED = _response("408 Request Timeout", "request: not received in time; the connection "
                     "was given to another client")


class _Connection:
    """What the server knows of one connection it serves: its socket and whether it is still
    waiting for its request to arrive (`since`: when that wait began) or running it (None)."""

    __slots__ = ("since", "sock")

    def __init__(self, sock):
        self.sock, self.since = sock, time.monotonic()


class AppServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer with at most `max_connections` connections served at once, where a
    connection still waiting for its request gives way to a new one (see the module docstring).

    The address family follows the host: `"::1"` binds IPv6, `"127.0.0.1"` IPv4.
    """

    daemon_threads = True
    #: connections the kernel queues before accept (socketserver's 5 drops a burst's SYNs, and
    #: every dropped one waits a second or more to retry)
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler, *,
                 max_connections: int = MAX_CONNECTIONS):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self._open: dict[int, _Connection] = {}  # id(socket) -> connection
        self.max_connections = max_connections
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False) and not self._evict_slowest():
            log.warning("%s: refused, %d requests running", client_address[0],
                        self.max_connections)
            with contextlib.suppress(OSError):  # the client may be gone already
                request.sendall(_BUSY)
            self.shutdown_request(request)
            return
        with self._lock:
            self._open[id(request)] = _Connection(request)
        try:
            super().process_request(request, client_address)  # starts the connection's thread
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def waiting(self, request) -> None:
        """The connection waits for its (next) request to arrive: it may give way."""
        with self._lock:
            if (c := self._open.get(id(request))) is not None:
                c.since = time.monotonic()

    def running(self, request) -> None:
        """The connection's request has arrived and runs: it keeps its slot."""
        with self._lock:
            if (c := self._open.get(id(request))) is not None:
                c.since = None

    def _forget(self, request) -> None:
        with self._lock:
            if self._open.pop(id(request), None) is None:
                return
        self._slots.release()

    def _evict_slowest(self) -> bool:
        """Close the connection that has waited longest for its request and take its slot; False
        when every connection is running a request."""
        with self._lock:
            waiting = [c for c in self._open.values() if c.since is not None]
            if not waiting:
                return False
            victim = min(waiting, key=lambda c: c.since)
            victim.since = None  # not chosen twice
        log.info("closing a connection that has not sent its request, for a new one")
        with contextlib.suppress(OSError):
            victim.sock.send(_EVICTED, getattr(socket, "MSG_DONTWAIT", 0))
        with contextlib.suppress(OSError):
            victim.sock.shutdown(socket.SHUT_RDWR)  # its thread's read returns; the slot frees
        return self._slots.acquire(timeout=5.0)

    def handle_error(self, request, client_address):
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            log.info("%s: connection closed (%s)", client_address[0], type(error).__name__)
        else:
            log.exception("%s: request failed", client_address[0])


class DeadlineHandler(BaseHTTPRequestHandler):
    """A request handler whose request line, headers and body share one deadline of `timeout`
    seconds; `request_arrived()` once the body is read ends the wait (the answer then has
    `timeout` per write)."""

    timeout = TIMEOUT
    deadline = 0.0

    def setup(self):
        super().setup()
        self.rfile = io.BufferedReader(_DeadlineReader(self), 8192)

    def handle_one_request(self):
        self.deadline = time.monotonic() + self.timeout
        if isinstance(self.server, AppServer):
            self.server.waiting(self.request)
        super().handle_one_request()

    def request_arrived(self) -> None:
        self.deadline = float("inf")
        self.connection.settimeout(self.timeout)
        if isinstance(self.server, AppServer):
            self.server.running(self.request)


class _DeadlineReader(io.RawIOBase):
    """The connection's bytes, each read given only what is left of the request's deadline."""

    def __init__(self, handler: DeadlineHandler):
        self.handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        h = self.handler
        left = h.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"request not received within {h.timeout:g} s")
        h.connection.settimeout(left)
        return h.connection.recv_into(buffer)
