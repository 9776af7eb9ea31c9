"""``veracity server``: the HTTP API (and, from later issues on, background services).

Migrates at start, serves until SIGTERM or SIGINT, then shuts down gracefully: uvicorn
stops accepting connections, finishes in-flight requests, and the store is closed. It
refuses to serve a non-loopback address without API tokens unless told ``--insecure``
(docs/security.md).
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
from prometheus_client import CollectorRegistry

from veracity.api import create_api
from veracity.app import App
from veracity.config import Settings, is_loopback
from veracity.control import ServiceMetrics, TokenService
from veracity.core.tokens import TokenState
from veracity.errors import ConfigError
from veracity.maintenance._loop import run_forever
from veracity.maintenance.reconciler import ReconcilerMetrics, ReconcilerService
from veracity.maintenance.recovery import RecoveryMetrics, RecoveryService
from veracity.runtime import Runtime, build_looker, open_runtime, redact_url
from veracity.worker.runner import Worker

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


def check_bind(settings: Settings, *, insecure: bool) -> None:
    """Refuse a non-loopback bind without API tokens, unless ``insecure`` says that
    something in front of the server authenticates every request."""
    if settings.auth_required or is_loopback(settings.host) or insecure:
        return
    raise ConfigError(
        f"refusing to serve on {settings.host} without authentication: auth.required is "
        f"false and {settings.host} is not a loopback address, so anyone who can reach "
        f"port {settings.port} could submit, cancel, pause, resolve and read every "
        "execution. Create API tokens (`veracity token create`) and leave auth.required "
        "to its default (true on this address), or, if something in front of Veracity "
        "authenticates every request, start it with --insecure (docs/security.md)")


async def _warn_without_tokens(settings: Settings, tokens: TokenService) -> None:
    if not settings.auth_required:
        if not is_loopback(settings.host):
            log.warning("serving %s WITHOUT authentication (--insecure): every request is "
                        "served unless it carries a bad token", settings.host,
                        extra={"domain": "server"})
        return
    views = await tokens.list()
    if not any(v.state is TokenState.ACTIVE for v in views):
        log.warning("API tokens are required and none is active: every /v1 request will "
                    "be refused (401); create one with `veracity token create`",
                    extra={"domain": "server"})


def wants_worker(settings: Settings, with_worker: bool | None) -> bool:
    """By default the server runs a worker in-process on SQLite (the embedded, one-process
    setup) and not on PostgreSQL, where workers are their own processes."""
    if with_worker is not None:
        return with_worker
    return settings.database_url.startswith("sqlite:")


def build_server_api(settings: Settings, *, with_worker: bool | None = None) -> FastAPI:
    registry = CollectorRegistry()

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        runtime: Runtime = await open_runtime(settings, migrate=True, engines=True)
        runtime.service.metrics = ServiceMetrics(registry)
        api.state.service = runtime.service
        api.state.runtime = runtime
        stop = asyncio.Event()
        recovery = RecoveryService(
            runtime.store,
            max_attempts=settings.recovery.max_attempts,
            metrics=RecoveryMetrics(registry),
        )
        engines = runtime.engines
        # the reconciler is always on: no setting turns it off
        reconciler = ReconcilerService(
            runtime.store, engines, runtime.external.limits,
            concurrency=settings.reconciler.concurrency,
            metrics=ReconcilerMetrics(registry),
            looker=build_looker(settings, runtime.external, engines),
        )
        tasks = [
            asyncio.create_task(run_forever(recovery, settings.recovery.interval, stop)),
            asyncio.create_task(run_forever(reconciler, settings.reconciler.interval, stop)),
        ]
        worker: Worker | None = None
        runnable = bool((runtime.app and runtime.app.workflows) or runtime.external.workflows)
        if wants_worker(settings, with_worker) and runnable:
            worker = Worker(runtime.store, runtime.app or App(), settings=settings.worker,
                            deployment_id=runtime.deployment_id, external=runtime.external,
                            engines=engines)
            runtime.service.on_submitted = worker.wake
            tasks.append(asyncio.create_task(worker.run(), name="veracity-worker"))
        await _warn_without_tokens(settings, TokenService(runtime.store))
        log.info(
            "started",
            extra={
                "domain": "server",
                "database": redact_url(settings.database_url),
                "auth_required": settings.auth_required,
                "deployment_id": runtime.deployment_id,
                "workflows": sorted(runtime.app.workflows) if runtime.app else [],
                "worker": worker.id if worker else None,
            },
        )
        try:
            yield
        finally:
            stop.set()
            if worker is not None:
                worker.stop()
            await asyncio.gather(*tasks, return_exceptions=True)
            await runtime.close()
            log.info("stopped", extra={"domain": "server"})

    return create_api(max_payload_bytes=settings.max_payload_bytes, lifespan=lifespan,
                      registry=registry, auth_required=settings.auth_required)


async def serve(settings: Settings, *, with_worker: bool | None = None) -> int:
    api = build_server_api(settings, with_worker=with_worker)
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
                tokens = ("API tokens required" if settings.auth_required
                          else "no API token required")
                print(f"Veracity is serving http://{host}:{port}  (API docs: "
                      f"http://{host}:{port}/docs; {tokens})", flush=True)
    await task
    # uvicorn leaves should_exit set after a clean shutdown; a failed start does not
    return 0 if server.started else 1


def run_server(settings: Settings, *, with_worker: bool | None = None) -> int:
    try:
        return asyncio.run(serve(settings, with_worker=with_worker))
    except KeyboardInterrupt:  # a second Ctrl-C while shutting down
        print("interrupted", file=sys.stderr)
        return 130
