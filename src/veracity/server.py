"""``veracity server``: the HTTP API (and, from later issues on, background services).

Migrates at start, serves until SIGTERM or SIGINT, then shuts down gracefully: uvicorn
stops accepting connections, finishes in-flight requests, and the store is closed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager, contextmanager

import uvicorn
from fastapi import FastAPI

from veracity.api import create_api
from veracity.config import Settings
from veracity.runtime import Runtime, open_runtime, redact_url

log = logging.getLogger("veracity.server")


class _Server(uvicorn.Server):
    """uvicorn's server, except that a graceful stop on SIGTERM/SIGINT exits with 0
    instead of re-raising the signal once shut down."""

    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        previous = {sig: signal.signal(sig, self.handle_exit)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def build_server_api(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        runtime: Runtime = await open_runtime(settings, migrate=True)
        api.state.service = runtime.service
        api.state.runtime = runtime
        log.info(
            "started",
            extra={
                "domain": "server",
                "database": redact_url(settings.database_url),
                "deployment_id": runtime.deployment_id,
                "workflows": sorted(runtime.app.workflows) if runtime.app else [],
            },
        )
        try:
            yield
        finally:
            await runtime.close()
            log.info("stopped", extra={"domain": "server"})

    return create_api(max_payload_bytes=settings.max_payload_bytes, lifespan=lifespan)


async def serve(settings: Settings) -> int:
    api = build_server_api(settings)
    config = uvicorn.Config(
        api,
        host=settings.host,
        port=settings.port,
        log_config=None,
        lifespan="on",
        timeout_graceful_shutdown=30,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if server.started:
        for srv in server.servers:
            for sock in srv.sockets:
                host, port = sock.getsockname()[:2]
                print(f"Veracity is serving http://{host}:{port}  (API docs: "
                      f"http://{host}:{port}/docs)", flush=True)
    await task
    # uvicorn leaves should_exit set after a clean shutdown; a failed start does not
    return 0 if server.started else 1


def run_server(settings: Settings) -> int:
    try:
        return asyncio.run(serve(settings))
    except KeyboardInterrupt:  # a second Ctrl-C while shutting down
        print("interrupted", file=sys.stderr)
        return 130
