"""Fixtures of the store conformance suite.

Every test runs once per backend through ``database_url`` (tests/conftest.py): a fresh,
migrated PostgreSQL database or SQLite file. Time is a :class:`ManualClock` shared by all
store instances of a test, so nothing here sleeps.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests._helpers import clocked_store_fixture
from tests._pg import create_database, drop_database, with_database
from tests.store._support import RawSQL, StoreFactory
from veracity.clock import Clock, ManualClock
from veracity.store import Store, open_store

store = clocked_store_fixture()


@pytest.fixture
async def open_extra_store(database_url: str, clock: ManualClock) -> AsyncIterator[StoreFactory]:
    """Open more store instances (own pool / own SQLite connection and thread) on the
    test's database, as separate processes would; all are closed after the test."""
    opened: list[Store] = []

    async def factory(
        url: str | None = None, *, clock_: Clock | None = None, pool_size: int = 2
    ) -> Store:
        extra = await open_store(url or database_url, clock=clock_ or clock, pool_size=pool_size)
        opened.append(extra)
        return extra

    try:
        yield factory
    finally:
        for extra in opened:
            await extra.close()


@pytest.fixture
def raw(database_url: str) -> RawSQL:
    """Plain SQL on the test's database, behind the store's back."""
    return RawSQL(database_url)


@pytest.fixture
def empty_database_url(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[str]:
    """A database with no schema at all (nothing migrated), for the given backend."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path}/empty.db"
        return
    server: str = request.getfixturevalue("pg_server_url")
    name = f"veracity_empty_{uuid.uuid4().hex}"
    create_database(server, name)
    try:
        yield with_database(server, name)
    finally:
        drop_database(server, name)
