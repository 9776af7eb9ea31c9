"""Stores: one protocol (:mod:`.protocol`), a PostgreSQL and an SQLite implementation."""

from __future__ import annotations

from veracity.clock import Clock, DatabaseClock
from veracity.errors import ConfigError
from veracity.store._common import RunnerLock
from veracity.store._ops import token_hash
from veracity.store.protocol import Store

__all__ = ["RunnerLock", "Store", "open_store", "token_hash"]


async def open_store(url: str, *, clock: Clock | None = None, pool_size: int = 10,
                     create: bool = True, generic_plans: bool = False) -> Store:
    """Open the store a database URL names: ``postgresql://...`` or ``sqlite:///path``.

    ``create=False``: an SQLite file that does not exist, or holds no Veracity database, is
    a :class:`ConfigError` (saying to migrate or to set database_url) instead of being
    created empty. ``generic_plans``: on PostgreSQL, plan each statement once per session
    (a worker's: docs/scaling.md, "What a worker's statements cost"); SQLite ignores it."""
    clock = clock or DatabaseClock()
    if url.startswith(("postgresql://", "postgres://")):
        from veracity.store.postgres import PostgresStore

        return await PostgresStore.open(url, clock=clock, pool_size=pool_size,
                                        generic_plans=generic_plans)
    if url.startswith("sqlite:///"):
        from veracity.store.sqlite import SqliteStore

        return await SqliteStore.open(url, clock=clock, create=create)
    raise ConfigError(
        f"database_url {url!r} is not supported: use postgresql://... or sqlite:///path"
    )
