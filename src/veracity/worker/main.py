"""``veracity worker``: a worker process, stopped gracefully by SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal

from veracity.adapters import build_engines, close_engines
from veracity.adapters.config import parse_external
from veracity.app import App
from veracity.bindings import resolve_http
from veracity.config import Settings
from veracity.errors import ConfigError
from veracity.maintenance._loop import run_forever
from veracity.maintenance.recovery import RecoveryService
from veracity.runtime import deployment_id_for, load_user_app, redact_url
from veracity.store import Store, open_store
from veracity.worker.runner import RateLimitedLog, Worker

log = logging.getLogger("veracity.worker")


async def open_store_patiently(settings: Settings, stop: asyncio.Event) -> Store | None:
    """Open the store, retrying with backoff while the database is unreachable; says so once
    per interval. None if asked to stop first."""
    trouble = RateLimitedLog(interval=10.0)
    delay = 0.2
    while not stop.is_set():
        try:
            return await open_store(settings.database_url,
                                    pool_size=min(32, settings.worker.concurrency + 4))
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
    store = await open_store_patiently(settings, stop)
    if store is None:
        return 0
    engines = build_engines(external)
    try:
        worker = Worker(
            store, app, settings=settings.worker,
            deployment_id=deployment_id_for(settings, app),
            external=external, engines=engines, http=bindings,
        )
        if stop.is_set():
            return 0
        print(f"Veracity worker {worker.id} running {len(worker.ffqns)} workflows "
              f"on {redact_url(settings.database_url)}", flush=True)
        # lease recovery runs in every worker too (one runner at a time across all
        # processes, by its lock): workers with no live server still recover
        recovery = RecoveryService(store, max_attempts=settings.recovery.max_attempts)
        recovering = asyncio.create_task(
            run_forever(recovery, settings.recovery.interval, stop), name="veracity-recovery")
        try:
            await worker.run()
        finally:
            stop.set()
            await recovering
    finally:
        await close_engines(engines)
        await store.close()
    return 0
