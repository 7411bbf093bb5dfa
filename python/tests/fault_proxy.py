"""An HTTP proxy for the object-store tests: it forwards every request to a server (moto_server) and injects
the faults a test asks for, so that cntkio's retries meet real failures on a real connection: error answers
(500, 503), answers delayed past the client's timeout, and bodies cut mid-way (the headers and half of the
body sent, then the connection closed). A `Translation` given to it turns requests the server does not
implement into ones it does."""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List, Optional, Tuple

# Headers that belong to one connection and are not passed on.
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


@dataclass
class Fault:
    """A fault applied to the next `times` requests (every one when `times` is None) whose method is
    `method` and whose path and query contain `where`.

    `action` is "status" (answer `status` without asking the server), "delay" (wait `delay_s` seconds,
    then forward) or "cut" (forward, then send the answer's headers and half of its body and close the
    connection). `hits` counts the requests it was applied to."""

    action: str
    method: str = "GET"
    where: str = ""
    times: Optional[int] = 1
    status: int = 503
    delay_s: float = 0.0
    hits: int = 0


class Translation:
    """Rewrites the requests the server does not implement into requests it does, and adds to the answer
    the headers the client expects from the original request. This one forwards everything as it is."""

    def request(self, method: str, path: str) -> Tuple[str, str]:
        """The method and the path (with the query) to send the server instead of `method` and `path`."""
        return method, path

    def answer_headers(self, method: str, path: str, status: int, body: bytes) -> List[Tuple[str, str]]:
        """Headers to add to the server's answer (`status`, `body`) to the client's `method` on `path`."""
        return []


class FaultProxy:
    """The proxy, listening on a free port of 127.0.0.1 (`url`) from construction until `close()`."""

    def __init__(self, upstream: str, translation: Optional[Translation] = None):
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.translation = translation or Translation()
        self.faults: List[Fault] = []
        self.requests: List[Tuple[str, str]] = []
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"proxy": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def inject(self, *faults: Fault) -> None:
        """Replaces the faults in force (none: every request is forwarded as it is)."""
        with self.lock:
            self.faults = list(faults)
            self.requests = []

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def take(self, method: str, path: str) -> Optional[Fault]:
        """Records the request and returns the fault to apply to it, if any."""
        with self.lock:
            self.requests.append((method, path))
            for f in self.faults:
                if f.method == method and f.where in path and (f.times is None or f.hits < f.times):
                    f.hits += 1
                    return f
        return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    proxy: FaultProxy

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass

    def do_GET(self) -> None:
        self.forward()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def forward(self) -> None:
        try:
            self.forward_or_fail()
        except OSError:
            # The client gave up (it timed out, or a fault closed the connection).
            self.close_connection = True

    def forward_or_fail(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        assert "chunked" not in (self.headers.get("Transfer-Encoding") or ""), "chunked requests are not handled"
        body = self.rfile.read(length) if length else None
        fault = self.proxy.take(self.command, self.path)
        if fault is not None and fault.action == "status":
            payload = b"<Error><Code>InternalError</Code><Message>injected by the test</Message></Error>"
            self.send_response_only(fault.status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
            return
        if fault is not None and fault.action == "delay":
            time.sleep(fault.delay_s)
        conn = http.client.HTTPConnection(*self.proxy.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            conn.request(*self.proxy.translation.request(self.command, self.path), body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            answer_headers = resp.getheaders()
            answer_headers += self.proxy.translation.answer_headers(self.command, self.path, resp.status, data)
        finally:
            conn.close()
        self.send_response_only(resp.status, resp.reason)
        for k, v in answer_headers:
            # A HEAD answer's Content-Length is the object's length: it is kept; others are the body's.
            if k.lower() in HOP_BY_HOP or (k.lower() == "content-length" and self.command != "HEAD"):
                continue
            self.send_header(k, v)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if fault is not None and fault.action == "cut":
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)
