"""Serving in a background thread with uvicorn: any ASGI app (:func:`serve_asgi_in_thread`), a
fake (:func:`serve_in_thread`), or a fake for the length of a ``with`` block
(:func:`running`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import uvicorn
from starlette.types import ASGIApp

from veracity.testing.fake_n8n.engine import FakeN8n
from veracity.testing.fake_n8n.web import create_app


def serve_asgi_in_thread(
    app: ASGIApp,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    before_stop: Callable[[], None] | None = None,
    startup_timeout: float = 10.0,
) -> tuple[str, Callable[[], None]]:
    """Serve any ASGI app with uvicorn on a background thread.

    Returns ``(base_url, stop)``. ``stop()`` (idempotent) calls ``before_stop``, asks the server
    to exit, joins the thread and closes the socket.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="on",
        ws="none",
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    failure: list[BaseException] = []

    def target() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=target, name=f"asgi-{host}:{bound_port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(5)
            sock.close()
            raise RuntimeError(f"the server did not start: {failure or 'timeout'}")
        time.sleep(0.005)
    stopped = threading.Event()

    def stop() -> None:
        if stopped.is_set():
            return
        stopped.set()
        if before_stop is not None:
            before_stop()
        server.should_exit = True
        thread.join(15)
        sock.close()
        if thread.is_alive():
            raise RuntimeError("the server thread did not stop")

    return f"http://{host}:{bound_port}", stop


def serve_in_thread(
    fake: FakeN8n, *, host: str = "127.0.0.1", port: int = 0
) -> tuple[str, Callable[[], None]]:
    """Serve ``fake`` on a free loopback port. Returns ``(base_url, stop)``."""
    return serve_asgi_in_thread(
        create_app(fake), host=host, port=port, before_stop=fake.release_hangs
    )


@contextlib.contextmanager
def running(fake: FakeN8n, *, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """``with running(fake) as base_url: ...`` serves ``fake`` for the block."""
    base_url, stop = serve_in_thread(fake, host=host, port=port)
    try:
        yield base_url
    finally:
        stop()
