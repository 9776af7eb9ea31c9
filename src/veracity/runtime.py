"""Wiring: from settings to an open store, the App, the deployment id and the service."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from veracity.adapters import build_engines, close_engines
from veracity.adapters.base import Engine
from veracity.adapters.config import ExternalConfig, parse_external
from veracity.adapters.looks import Looker
from veracity.app import App, load_app
from veracity.config import Settings
from veracity.core.params import ParamsShape, shapes_of_functions
from veracity.store import Store, open_store

if TYPE_CHECKING:
    # imported where they are used: a worker, which opens no runtime, starts without the
    # service and the cron parser (some 30 ms of its start-up; bench/startup.py)
    from veracity.control import ExecutionService
    from veracity.core.cron import CronEntry


@dataclass
class Runtime:
    settings: Settings
    app: App | None
    store: Store
    service: ExecutionService
    deployment_id: str
    external: ExternalConfig
    engines: dict[str, Engine] = field(default_factory=dict)
    """The engines' adapters, when the runtime was opened with them."""
    crons: list[CronEntry] = field(default_factory=list)
    """The ``[[cron]]`` entries (docs/cron.md), validated."""

    async def close(self) -> None:
        try:
            await self.service.close()
            await close_engines(self.engines)
        finally:
            await self.store.close()


def build_looker(settings: Settings, external: ExternalConfig,
                 engines: Mapping[str, Engine]) -> Looker:
    """Looks at delegated runs as the reconciler takes them (docs/external.md)."""
    return Looker(
        engines, external.limits,
        engine_timeout=settings.reconciler.engine_timeout,
        # a trigger in flight has no external id yet: flag only once it cannot be
        trigger_grace={name: engine.timeout + 1.0 for name, engine in external.engines.items()},
        stop_flag_after=settings.reconciler.stop_flag_after,
    )


def load_user_app(settings: Settings) -> App | None:
    return load_app(settings.app) if settings.app else None


def workflows_of(app: App | None, external: ExternalConfig) -> set[str]:
    """Every workflow this configuration can start: the app's and the external ones."""
    return (set(app.workflows) if app else set()) | set(external.workflows)


def cron_entries(settings: Settings, app: App | None, external: ExternalConfig
                 ) -> list[CronEntry]:
    """The ``[[cron]]`` entries, validated against the workflows this configuration has
    (and their params against the signatures of the app's workflows); a ConfigError names
    the entry at fault."""
    from veracity.core.cron import parse_cron_entries

    return parse_cron_entries(settings.cron, workflows=workflows_of(app, external),
                              max_payload_bytes=settings.max_payload_bytes,
                              shapes=shapes_of(app))


def shapes_of(app: App | None) -> dict[str, ParamsShape]:
    """The parameters each of the app's workflows takes (checked at submission)."""
    return shapes_of_functions({ffqn: wf.fn for ffqn, wf in
                                (app.workflows if app else {}).items()})


def deployment_id_for(settings: Settings, app: App | None) -> str:
    if settings.deployment_id:
        return settings.deployment_id
    return (app or App()).code_digest()


async def open_runtime(settings: Settings, *, migrate: bool = False,
                       engines: bool = False, read_only: bool = False,
                       app: App | None = None, create: bool | None = None) -> Runtime:
    """Open the store and build the service. ``engines``: also build the engines'
    adapters, so that the service can ask an engine about a delegated run (resolve,
    cancel); the runtime closes them. ``read_only``: for commands that only read: the
    engines are not configured (their secrets are not needed), and a database that does
    not exist yet is an error instead of being created. ``app``: this App instead of the
    settings' ``app`` (a program that holds its App already). ``create``: whether a
    missing SQLite file may be created (default: unless ``read_only``); a command that
    needs Veracity's tables passes False, so that failing leaves no empty file behind."""
    from veracity.control import ExecutionService

    app = app if app is not None else load_user_app(settings)
    external = ExternalConfig(None, {}, {}) if read_only else parse_external(settings)
    # a command that only reads validates no [[cron]] entry
    crons = [] if read_only else cron_entries(settings, app, external)
    adapters = build_engines(external) if engines else {}
    store = await open_store(settings.database_url,
                             create=not read_only if create is None else create)
    try:
        if migrate:
            await store.migrate()
        deployment_id = deployment_id_for(settings, app)
        service = ExecutionService(
            store,
            workflows=workflows_of(app, external),
            deployment_id=deployment_id,
            max_payload_bytes=settings.max_payload_bytes,
            # a worker is live for at most one lease TTL after its last heartbeat (sooner
            # not live when it records its heartbeat interval: core.deployments.is_live)
            live_within=timedelta(seconds=settings.worker.lease_ttl),
            looker=build_looker(settings, external, adapters),
            crons=crons,
            recovery_interval=timedelta(seconds=settings.recovery.interval),
            max_attempts=settings.recovery.max_attempts,
            shapes=shapes_of(app),
        )
    except BaseException:
        await close_engines(adapters)
        await store.close()
        raise
    return Runtime(settings, app, store, service, deployment_id, external, adapters, crons)


def redact_url(url: str) -> str:
    """The URL without its password, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))
