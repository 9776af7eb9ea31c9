"""``veracity worker``: a worker process, stopped gracefully by SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import traceback
from typing import TYPE_CHECKING, Any

from veracity._heap import settle
from veracity.adapters import build_engines, close_engines
from veracity.adapters.config import parse_external
from veracity.app import App
from veracity.bindings import resolve_http
from veracity.config import Settings
from veracity.errors import ConfigError
from veracity.host import host_key
from veracity.maintenance._loop import run_forever
from veracity.maintenance.recovery import RecoveryMetrics, RecoveryService
from veracity.runtime import deployment_id_for, load_user_app, redact_url
from veracity.store import Store, open_store
from veracity.worker.runner import RateLimitedLog, Worker

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from veracity.telemetry import Telemetry

log = logging.getLogger("veracity.worker")


async def open_store_patiently(settings: Settings, stop: asyncio.Event) -> Store | None:
    """Open the store, retrying with backoff while the database is unreachable; says so once
    per interval. None if asked to stop first."""
    trouble = RateLimitedLog(interval=10.0)
    delay = 0.2
    while not stop.is_set():
        try:
            return await open_store(settings.database_url,
                                    pool_size=min(20, settings.worker.concurrency + 4),
                                    generic_plans=True)
        except ConfigError:
            raise
        except Exception as exc:
            trouble.warning("db", "cannot reach the database %s, retrying: %s",
                            redact_url(settings.database_url), exc)
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
            except TimeoutError:
                pass
            delay = min(delay * 2, 1.0)
    return None


def serve_metrics(settings: Settings, telemetry: Telemetry) -> WSGIServer | None:
    """The worker's Prometheus endpoint (``/metrics``, any path answers) on
    ``worker.metrics_port``, if set; served from a thread of its own."""
    port = settings.worker.metrics_port
    if port is None:
        return None
    from prometheus_client import start_http_server

    try:
        server, _ = start_http_server(port, settings.worker.metrics_host,
                                      registry=telemetry.registry)
    except OSError as exc:
        raise ConfigError(f"worker.metrics_port: cannot listen on "
                          f"{settings.worker.metrics_host}:{port}: {exc}") from None
    print(f"Veracity worker metrics at http://{settings.worker.metrics_host}:{port}/metrics",
          flush=True)
    return server


def task_stacks() -> dict[str, str]:
    """Each task of the running loop, by name: the chain of coroutines it awaits, from its
    own to the innermost (``Task.get_stack`` gives only the outermost of a suspended one)."""
    found: dict[str, str] = {}
    for task in asyncio.all_tasks():
        frames = []
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None) \
                or getattr(awaited, "ag_frame", None)
            if frame is None:
                break
            frames.append((frame, frame.f_lineno))
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom",
                                                                     None)
        where = "".join(traceback.StackSummary.extract(frames).format()).rstrip()
        found[task.get_name()] = where or ("done" if task.done() else "running")
    return found


def log_tasks() -> None:
    log.warning("tasks", extra={"domain": "worker", "tasks": task_stacks()})


async def run_worker(settings: Settings) -> int:
    # the pool reports every reconnection attempt itself; the worker's own rate-limited
    # messages say it once per interval instead
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    app = load_user_app(settings) or App()
    external = parse_external(settings)
    if not app.workflows and not external.workflows:
        raise ConfigError("a worker needs workflows to run: set app (VERACITY_APP) or "
                          "[[external_workflow]] entries")
    # a secret a binding names and nobody defined stops the start (docs/http.md)
    bindings = resolve_http(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    worker: Worker | None = None

    def on_signal() -> None:
        stop.set()
        if worker is not None:
            worker.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    # SIGUSR1: what each of the worker's tasks is waiting on, in one log line (docs/workers.md,
    # "A worker that does not stop")
    loop.add_signal_handler(signal.SIGUSR1, log_tasks)
    store = await open_store_patiently(settings, stop)
    if store is None:
        return 0
    try:  # a pooler in transaction mode: refuse to run (docs/scaling.md, Connection poolers)
        await store.check_session()
    except BaseException:
        await store.close()
        raise
    engines = build_engines(external)
    try:
        # metrics are counted where they are served: a worker without worker.metrics_port
        # never loads the Prometheus client (some 20 ms of its start; bench/journal.md)
        telemetry: Telemetry | None = None
        if settings.worker.metrics_port is not None:
            from veracity.telemetry import Telemetry

            telemetry = Telemetry()
        worker = Worker(
            store, app, settings=settings.worker,
            deployment_id=deployment_id_for(settings, app),
            external=external, engines=engines, http=bindings, telemetry=telemetry,
        )
        if stop.is_set():
            return 0
        exporter = serve_metrics(settings, telemetry) if telemetry is not None else None
        print(f"Veracity worker {worker.id} running {len(worker.ffqns)} workflows "
              f"on {redact_url(settings.database_url)}", flush=True)
        # lease recovery runs in every worker too (one runner at a time across all
        # processes, by its lock): workers with no live server still recover, and a worker
        # killed beside this one is recovered at once (docs/workers.md)
        recovery = RecoveryService(store, max_attempts=settings.recovery.max_attempts,
                                   metrics=(RecoveryMetrics(telemetry.registry)
                                            if telemetry is not None else None),
                                   telemetry=telemetry, host_key=host_key())
        recovering = asyncio.create_task(
            run_forever(recovery, settings.recovery.interval, stop), name="veracity-recovery")
        # started: the collector's settings of a long run (veracity/_heap.py)
        settle(settings.gc_young_threshold)
        try:
            await worker.run()
        finally:
            stop.set()
            await recovering
            if exporter is not None:
                exporter.shutdown()
                exporter.server_close()
    finally:
        await close_engines(engines)
        await store.close()
    return 0
