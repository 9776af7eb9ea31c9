"""``veracity server``: the HTTP API and the background services (lease recovery, the
reconciler, cron, and on SQLite by default a worker).

Migrates at start, serves until SIGTERM or SIGINT, then shuts down gracefully: uvicorn
stops accepting connections, finishes in-flight requests, and the store is closed. It
refuses to serve a non-loopback address without API tokens unless told ``--insecure``
(docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager, contextmanager
from types import FrameType

import uvicorn
import uvloop
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from veracity._heap import settle
from veracity.api import create_api
from veracity.api.transport import protocol_with
from veracity.app import App
from veracity.bindings import resolve_http
from veracity.config import Settings, is_loopback
from veracity.control import ExecutionService, ServiceMetrics, TokenService
from veracity.core.tokens import TokenState
from veracity.errors import ConfigError
from veracity.host import host_key
from veracity.maintenance._loop import run_forever
from veracity.maintenance.cron import CronMetrics, CronService
from veracity.maintenance.deployments import DeploymentBeacon
from veracity.maintenance.reconciler import ReconcilerMetrics, ReconcilerService
from veracity.maintenance.recovery import RecoveryMetrics, RecoveryService
from veracity.maintenance.retention import RetentionMetrics, RetentionService
from veracity.runtime import Runtime, build_looker, open_runtime, redact_url
from veracity.telemetry import Telemetry
from veracity.worker.runner import Worker

log = logging.getLogger("veracity.server")


class _Server(uvicorn.Server):
    """uvicorn's server, except that a graceful stop on SIGTERM/SIGINT exits with 0
    instead of re-raising the signal once shut down, and answers the long polls under way
    at once (``?wait=``: with the state their executions have) instead of waiting for
    them to time out."""

    def __init__(self, config: uvicorn.Config, api: FastAPI) -> None:
        super().__init__(config)
        self.api = api

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        service: ExecutionService | None = getattr(self.api.state, "service", None)
        if service is not None:
            with contextlib.suppress(RuntimeError):  # no loop runs any more
                asyncio.get_running_loop().call_soon_threadsafe(service.release_waits)

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
    telemetry = Telemetry(registry)

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        # a secret a binding names and nobody defined stops the start (docs/http.md)
        bindings = resolve_http(settings)
        runtime: Runtime = await open_runtime(settings, migrate=True, engines=True)
        try:  # a pooler in transaction mode: refuse to run (docs/scaling.md)
            await runtime.store.check_session()
        except BaseException:
            await runtime.close()
            raise
        runtime.service.metrics = ServiceMetrics(registry)
        runtime.service.telemetry = telemetry
        api.state.service = runtime.service
        api.state.runtime = runtime
        stop = asyncio.Event()
        recovery = RecoveryService(
            runtime.store,
            max_attempts=settings.recovery.max_attempts,
            metrics=RecoveryMetrics(registry),
            telemetry=telemetry,
            host_key=host_key(),  # workers killed on this host: recovered at once
        )
        engines = runtime.engines
        # the server's deployment is recorded before it serves (a failure stops the start),
        # then seen again as often as a worker's heartbeat sees its own
        beacon = DeploymentBeacon(runtime.store, runtime.deployment_id)
        await beacon.run_once()
        # the reconciler is always on: no setting turns it off
        reconciler = ReconcilerService(
            runtime.store, engines, runtime.external.limits,
            concurrency=settings.reconciler.concurrency,
            metrics=ReconcilerMetrics(registry),
            looker=build_looker(settings, runtime.external, engines),
            telemetry=telemetry,
        )
        # every server runs cron: each slot's unique key makes it start once (docs/cron.md)
        cron = CronService(runtime.store, runtime.crons, deployment_id=runtime.deployment_id,
                           metrics=CronMetrics(registry))
        if runtime.crons:
            await cron.register()  # first seen now: a new entry never fills in the past
        tasks = [
            asyncio.create_task(run_forever(recovery, settings.recovery.interval, stop)),
            asyncio.create_task(run_forever(reconciler, settings.reconciler.interval, stop)),
            asyncio.create_task(run_forever(
                beacon, settings.worker.effective_heartbeat_interval, stop)),
        ]
        if runtime.crons:
            tasks.append(asyncio.create_task(cron.run(stop), name="veracity-cron"))
        # every server runs retention, one at a time (docs/operations.md, Retention); its
        # metrics are served even when it is off (retention.terminal = 0), all at zero
        retention_metrics = RetentionMetrics(registry)
        if settings.retention.enabled:
            retention = RetentionService(runtime.store, older_than=settings.retention.terminal,
                                         metrics=retention_metrics)
            tasks.append(asyncio.create_task(run_forever(
                retention, settings.retention.interval, stop), name="veracity-retention"))
        worker: Worker | None = None
        runnable = bool((runtime.app and runtime.app.workflows) or runtime.external.workflows)
        if wants_worker(settings, with_worker) and runnable:
            worker = Worker(runtime.store, runtime.app or App(), settings=settings.worker,
                            deployment_id=runtime.deployment_id, external=runtime.external,
                            engines=engines, http=bindings, telemetry=telemetry)
            runtime.service.on_submitted = worker.wake
            runtime.service.on_interrupt = worker.interrupted
            cron.on_started = worker.wake
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
                "http": bindings.describe(),
                "crons": [c.name for c in runtime.crons],
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
                      registry=registry, auth_required=settings.auth_required,
                      telemetry=telemetry)


def listen(host: str, port: int) -> list[socket.socket]:
    """The server's listening sockets, bound before anything else is done, as asyncio's
    ``create_server`` would bind them for ``host`` (one per address it names: "localhost"
    may be two; an IPv6 one takes IPv6 only): a port in use, or a host that is not this
    machine's, is a :class:`ConfigError` naming them, before the database is touched."""
    def refused(why: object) -> ConfigError:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return ConfigError(f"cannot listen on {where}: {why} (set --port / VERACITY_PORT, "
                           "or --host / VERACITY_HOST)")

    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise refused(exc.strerror or exc) from None
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.set_inheritable(True)
    except OSError as exc:
        for sock in socks:
            sock.close()
        raise refused(exc.strerror or exc) from None
    return socks


async def serve(settings: Settings, *, with_worker: bool | None = None,
                socks: list[socket.socket] | None = None) -> int:
    """Serve the API on ``socks`` (default: :func:`listen` on the settings' host and
    port) until SIGTERM or SIGINT."""
    if socks is None:
        socks = listen(settings.host, settings.port)
    api = build_server_api(settings, with_worker=with_worker)
    config = uvicorn.Config(
        api,
        host=settings.host,
        port=settings.port,
        log_config=None,
        lifespan="on",
        timeout_graceful_shutdown=30,
        http=protocol_with(settings.server.read_timeout),
        # uvicorn counts the connection a request came on among those it compares with
        # its limit: max_connections connections served at once, the next one refused
        limit_concurrency=settings.server.max_connections + 1,
    )
    server = _Server(config, api)
    task = asyncio.create_task(server.serve(sockets=socks))
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    # started: the collector's settings of a long run (veracity/_heap.py)
    settle(settings.gc_young_threshold)
    if server.started:
        for srv in server.servers:
            for sock in srv.sockets:
                host, port = sock.getsockname()[:2]
                host = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL
                tokens = ("API tokens required" if settings.auth_required
                          else "no API token required")
                print(f"Veracity is serving http://{host}:{port}  (API docs: "
                      f"http://{host}:{port}/docs; {tokens})", flush=True)
    await task
    # uvicorn leaves should_exit set after a clean shutdown; a failed start does not
    return 0 if server.started else 1


def one_server_per_sqlite_file(settings: Settings) -> int | None:
    """On SQLite, hold an exclusive lock beside the database for the server's life: a
    second ``veracity server`` on the same file refuses to start instead of competing
    (workers may share the file; a server runs the background services). Returns the
    descriptor that holds the lock (kept open), None for PostgreSQL; raises ConfigError
    when another server holds it."""
    if not settings.database_url.startswith("sqlite:///"):
        return None
    from veracity.store.sqlite.store import path_from_url

    path = path_from_url(settings.database_url)
    lock = path.with_name(f"{path.name}.server.lock")
    if not lock.parent.is_dir():
        return None  # the store names the missing folder itself
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ConfigError(
            f"another veracity server (pid {holder}) is already serving {path}: an SQLite "
            "database has one server (workers may share it); stop that one, or use "
            "PostgreSQL to run several servers") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def run_server(settings: Settings, *, with_worker: bool | None = None) -> int:
    try:
        # the port first: one in use is refused before anything is written (the SQLite
        # file's lock, the database)
        socks = listen(settings.host, settings.port)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        one_server_per_sqlite_file(settings)  # held until the process ends
    except ConfigError as exc:
        for sock in socks:
            sock.close()
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        # uvloop (uvicorn[standard] brings it), as `veracity worker` runs: the same
        # asyncio, its loop in C; some 5 % more submissions/s here (bench/journal.md)
        return uvloop.run(serve(settings, with_worker=with_worker, socks=socks))
    except KeyboardInterrupt:  # a second Ctrl-C while shutting down
        print("interrupted", file=sys.stderr)
        return 130
