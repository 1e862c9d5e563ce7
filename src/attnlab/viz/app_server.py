"""The HTTP server under `attnlab serve`: bounded connections, timeouts, IPv4 or IPv6.

http.server's ThreadingHTTPServer starts one thread per connection and lets a connection sit
forever: a thousand half-sent requests make a thousand threads. `AppServer` caps the connections
being served at once (the next one gets a 503 and is closed), the handler's `timeout` closes a
connection that sends nothing for that long, and a client that hangs up mid-answer is one log
line, not a traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import sys
import threading
from http.server import ThreadingHTTPServer

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 32  # connections served at once; more get 503 and are closed


def _busy_response() -> bytes:
    body = json.dumps({"error": "busy: too many open connections, try again"}).encode()
    head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + body


class AppServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer with at most `max_connections` connections served at once.

    The address family follows the host: `"::1"` binds IPv6, `"127.0.0.1"` IPv4.
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler, *,
                 max_connections: int = MAX_CONNECTIONS):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._slots = threading.BoundedSemaphore(max_connections)
        self.max_connections = max_connections
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            log.warning("%s: refused, %d connections open", client_address[0],
                        self.max_connections)
            with contextlib.suppress(OSError):  # the client may be gone already
                request.sendall(_busy_response())
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # starts the connection's thread
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address):
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            log.info("%s: connection closed (%s)", client_address[0], type(error).__name__)
        else:
            log.exception("%s: request failed", client_address[0])
