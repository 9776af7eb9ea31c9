"""Wiring: from settings to an open store, the App, the deployment id and the service."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

from veracity._app import App, load_app
from veracity.config import Settings
from veracity.external import ExternalConfig, parse_external
from veracity.service import ExecutionService
from veracity.store import Store, open_store


@dataclass
class Runtime:
    settings: Settings
    app: App | None
    store: Store
    service: ExecutionService
    deployment_id: str
    external: ExternalConfig

    async def close(self) -> None:
        await self.store.close()


def load_user_app(settings: Settings) -> App | None:
    return load_app(settings.app) if settings.app else None


def deployment_id_for(settings: Settings, app: App | None) -> str:
    if settings.deployment_id:
        return settings.deployment_id
    return (app or App()).code_digest()


async def open_runtime(settings: Settings, *, migrate: bool = False) -> Runtime:
    app = load_user_app(settings)
    external = parse_external(settings)
    store = await open_store(settings.database_url)
    try:
        if migrate:
            await store.migrate()
        deployment_id = deployment_id_for(settings, app)
        service = ExecutionService(
            store,
            workflows=(set(app.workflows) if app else set()) | set(external.workflows),
            deployment_id=deployment_id,
            max_payload_bytes=settings.max_payload_bytes,
            # a worker that has not renewed for a whole lease TTL is taken for dead
            live_within=timedelta(seconds=settings.worker.lease_ttl),
        )
    except BaseException:
        await store.close()
        raise
    return Runtime(settings, app, store, service, deployment_id, external)


def redact_url(url: str) -> str:
    """The URL without its password, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))
