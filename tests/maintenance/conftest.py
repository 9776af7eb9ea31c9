"""Fixtures of the periodic-service tests: a store on a fresh database of each backend,
whose time is a :class:`ManualClock` (shared with any extra store the test opens)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests._helpers import clocked_store_fixture
from veracity.clock import ManualClock
from veracity.store import Store, open_store

StoreFactory = Callable[[], Awaitable[Store]]


store = clocked_store_fixture(pool_size=2)


@pytest.fixture
async def other_store(database_url: str, clock: ManualClock) -> AsyncIterator[StoreFactory]:
    """Open more store instances on the test's database (as other server processes would);
    all are closed after the test."""
    opened: list[Store] = []

    async def factory() -> Store:
        extra = await open_store(database_url, clock=clock, pool_size=2)
        opened.append(extra)
        return extra

    try:
        yield factory
    finally:
        for extra in opened:
            await extra.close()
