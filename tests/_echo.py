"""A loopback HTTP server for the ctx.http tests: it records every request it receives
(method, path, headers) and answers with them as JSON, the request's headers included; so
a test sees both what went on the wire and what a step could make of an answer that echoes
a secret.

Every answer also carries the request's Authorization back in its ``X-Echo-Authorization``
header (as some servers do in their errors), so a step's answer, and an HTTP library's
debug log of the answer's headers, hold a secret to leak.

Routes: any path echoes; ``/redirect?to=URL`` answers 302 to URL; ``/cookie`` sets a
cookie; ``/status/<code>`` answers that status (with the echo as its body).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    """Header names in lower case."""


class EchoServer:
    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                seen = Seen(self.command, self.path,
                            {k.lower(): v for k, v in self.headers.items()})
                with server._lock:
                    server.seen.append(seen)
                parts = urlsplit(self.path)
                status, extra = 200, {}
                if parts.path == "/redirect":
                    status = 302
                    extra["Location"] = parse_qs(parts.query)["to"][0]
                elif parts.path == "/cookie":
                    extra["Set-Cookie"] = "session=from-the-echo-server; Path=/"
                elif parts.path.startswith("/status/"):
                    status = int(parts.path.rsplit("/", 1)[1])
                payload = json.dumps({"method": seen.method, "path": seen.path,
                                      "headers": seen.headers,
                                      "body": body.decode("utf-8", "replace")}).encode()
                self.send_response(status)
                if "authorization" in seen.headers:
                    extra["X-Echo-Authorization"] = seen.headers["authorization"]
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _answer

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet: the test reads ``seen``

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        # serve_forever looks for shutdown() every poll_interval (0.5 s by default): each
        # stop() waited for that, 1 s a test of test_http.py's three servers
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.02}, daemon=True)

    def requests(self, path_prefix: str = "/") -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.path.startswith(path_prefix)]

    def start(self) -> EchoServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@contextmanager
def echo_server() -> Iterator[EchoServer]:
    server = EchoServer().start()
    try:
        yield server
    finally:
        server.stop()
