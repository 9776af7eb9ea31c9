"""Helpers shared by the test folders: a store opened on the test's database as a fixture,
reading an execution and its history, and polling until something holds.

The store fixtures are made here and named where they are used, e.g. in a conftest.py::

    store = store_fixture(pool_size=4)          # on ``database_url`` (both backends)
    store = clocked_store_fixture(pool_size=2)  # the same, with the test's ``clock``
    pg_store = pg_store_fixture()               # on ``pg_url`` (PostgreSQL only)
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from veracity.clock import Clock
from veracity.core.states import Status
from veracity.models import Execution, HistoryEvent
from veracity.store import Store, open_store

# -- stores -------------------------------------------------------------------------------


@asynccontextmanager
async def opened_store(
    url: str, *, pool_size: int | None = None, clock: Clock | None = None
) -> AsyncIterator[Store]:
    """A store on *url* for the block (``open_store``'s defaults where not given)."""
    kwargs: dict[str, Any] = {}
    if pool_size is not None:
        kwargs["pool_size"] = pool_size
    if clock is not None:
        kwargs["clock"] = clock
    store = await open_store(url, **kwargs)
    try:
        yield store
    finally:
        await store.close()


def store_fixture(*, pool_size: int | None = None, name: str = "store") -> Any:
    """A fixture: a store on the test's ``database_url`` (so the test runs on each backend),
    closed after the test."""

    async def fixture(database_url: str) -> AsyncIterator[Store]:
        async with opened_store(database_url, pool_size=pool_size) as store:
            yield store

    return pytest.fixture(name=name)(fixture)


def clocked_store_fixture(*, pool_size: int | None = None, name: str = "store") -> Any:
    """A fixture: a store on the test's ``database_url`` whose time is the test's ``clock``
    fixture, closed after the test."""

    async def fixture(database_url: str, clock: Clock) -> AsyncIterator[Store]:
        async with opened_store(database_url, pool_size=pool_size, clock=clock) as store:
            yield store

    return pytest.fixture(name=name)(fixture)


def pg_store_fixture(*, pool_size: int | None = None, name: str = "pg_store") -> Any:
    """A fixture: a store on the test's ``pg_url`` (PostgreSQL only), closed after the test."""

    async def fixture(pg_url: str) -> AsyncIterator[Store]:
        async with opened_store(pg_url, pool_size=pool_size) as store:
            yield store

    return pytest.fixture(name=name)(fixture)


# -- executions ---------------------------------------------------------------------------


async def get(store: Store, execution_id: uuid.UUID) -> Execution:
    """The execution, which must exist."""
    found = await store.execution_get(execution_id)
    assert found is not None, f"execution {execution_id} does not exist"
    return found


async def history(store: Store, execution_id: uuid.UUID) -> list[HistoryEvent]:
    """Its whole history (up to 10,000 events), in order."""
    return await store.history_list(execution_id, limit=10_000)


async def kinds(store: Store, execution_id: uuid.UUID) -> list[str]:
    return [e.kind for e in await history(store, execution_id)]


async def events(store: Store, execution_id: uuid.UUID, kind: str) -> list[HistoryEvent]:
    return [e for e in await history(store, execution_id) if e.kind == kind]


# -- polling ------------------------------------------------------------------------------


async def until(
    check: Callable[[], Awaitable[Any]], *, timeout: float = 10.0, what: str = "condition"
) -> Any:
    """Poll ``check`` until it returns something truthy; return that."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = await check()
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def wait_status(
    store: Store, execution_id: uuid.UUID, *statuses: Status, timeout: float = 10.0
) -> Execution:
    """Poll until the execution has one of ``statuses``; return it."""

    async def check() -> Execution | None:
        ex = await store.execution_get(execution_id)
        return ex if ex is not None and ex.status in statuses else None

    got: Execution = await until(
        check, timeout=timeout, what=f"{execution_id} to be {'/'.join(statuses)}")
    return got
