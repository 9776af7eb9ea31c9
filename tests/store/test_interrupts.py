"""Store conformance: interrupt notifications (``Store.interrupt_notifications``), which
tell listening workers at once that a running execution was asked to stop (cancel or
pause), so they need not wait for their next heartbeat's ``execution_interrupts``.

PostgreSQL: a trigger NOTIFYs ``veracity_interrupt`` with the execution's id whenever a
*running* execution's cancel or pause request is set; every listening store yields the
id. SQLite: ``supports_notifications`` is False and iterating raises NotImplementedError
(workers learn at heartbeat, through ``execution_interrupts``). Runs on every backend.

Nothing here waits for silence: that no other notification was sent is shown by a marker
notification sent afterwards arriving next (notifications arrive in commit order).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator
from typing import cast

import psycopg
import pytest

from tests.store._support import (
    RawSQL,
    StoreFactory,
    claim_exactly,
    get,
    new_child,
    submit_unique,
)
from veracity.core.states import Status
from veracity.store import Store

WAIT = 5.0  # seconds: an upper bound for a notification that is due, never waited out


class Listener:
    """``interrupt_notifications()`` of one store, known to be listening.

    LISTEN runs when the generator is first awaited, so :meth:`start` sends marker
    notifications (random ids, straight through ``pg_notify``) until one comes back;
    markers are left out of what :meth:`next` returns. Every listener hears every
    marker: listeners of one test share ``markers``."""

    def __init__(self, store: Store, raw: RawSQL, markers: set[uuid.UUID]) -> None:
        self.notifications = cast(AsyncGenerator[uuid.UUID, None],
                                  store.interrupt_notifications())
        self.raw = raw
        self.markers = markers

    async def _mark(self) -> uuid.UUID:
        marker = uuid.uuid4()
        self.markers.add(marker)
        await asyncio.to_thread(self.raw.execute,
                                "SELECT pg_notify('veracity_interrupt', ?)", [str(marker)])
        return marker

    async def start(self) -> None:
        async def first() -> uuid.UUID:
            return await anext(self.notifications)

        waiting = asyncio.create_task(first())
        try:
            async with asyncio.timeout(WAIT):
                while not waiting.done():
                    await self._mark()
                    await asyncio.wait({waiting}, timeout=0.05)
        finally:
            if not waiting.done():
                waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        assert waiting.result() in self.markers

    async def next(self) -> uuid.UUID:
        """The next notified id that is not a marker (fails after WAIT seconds)."""
        while True:
            got = await asyncio.wait_for(anext(self.notifications), WAIT)
            if got not in self.markers:
                return got

    async def until_marker(self) -> list[uuid.UUID]:
        """Every id notified before a marker sent now (markers of start left out)."""
        marker = await self._mark()
        seen: list[uuid.UUID] = []
        while (got := await asyncio.wait_for(anext(self.notifications), WAIT)) != marker:
            if got not in self.markers:
                seen.append(got)
        return seen

    async def close(self) -> None:
        await self.notifications.aclose()


async def running(store: Store, *, cancellable: bool = False, owner: str = "worker-a") -> uuid.UUID:
    execution = await submit_unique(store, cancellable=cancellable)
    await claim_exactly(store, execution.id, owner=owner)
    return execution.id


async def assert_not_supported(store: Store) -> None:
    """SQLite: the generator raises at once, saying what to do instead."""
    with pytest.raises(NotImplementedError, match="heartbeat"):
        await anext(aiter(store.interrupt_notifications()))


async def test_sqlite_has_no_interrupt_notifications_and_workers_learn_at_heartbeat(
    store: Store, backend: str
) -> None:
    assert store.supports_notifications is (backend == "postgresql")
    if store.supports_notifications:
        return  # the PostgreSQL behaviour is the next tests' subject
    await assert_not_supported(store)
    # what a worker does instead, at each heartbeat
    cancelled = await running(store, cancellable=True)
    paused = await running(store)
    assert (await store.execution_cancel(cancelled)).changed
    assert (await store.execution_pause(paused)).changed
    interrupts = {i.claim.execution_id: i.kind
                  for i in await store.execution_interrupts("worker-a")}
    assert interrupts == {cancelled: "cancel", paused: "pause"}


async def test_cancel_and_pause_of_running_executions_are_notified(
    store: Store, open_extra_store: StoreFactory, raw: RawSQL
) -> None:
    if not store.supports_notifications:
        await assert_not_supported(store)
        return
    # two workers' stores listen; another store (the API's) makes the requests
    markers: set[uuid.UUID] = set()
    listeners = [Listener(await open_extra_store(), raw, markers) for _ in range(2)]
    try:
        for listener in listeners:
            await listener.start()

        # not running: nothing to interrupt, nothing notified
        pending = await submit_unique(store, cancellable=True)
        assert (await store.execution_cancel(pending.id)).changed
        assert (await get(store, pending.id)).status == Status.CANCELLED
        assert (await store.execution_pause((await submit_unique(store)).id)).changed

        cancelled = await running(store, cancellable=True)
        result = await store.execution_cancel(cancelled)
        assert result.changed and result.execution is not None
        assert result.execution.status == Status.RUNNING  # it stops at its next await
        for listener in listeners:
            assert await listener.next() == cancelled
        assert not (await store.execution_cancel(cancelled)).changed  # again: no news

        paused = await running(store)
        result = await store.execution_pause(paused)
        assert result.changed and result.execution is not None
        assert result.execution.pause_requested_at is not None
        for listener in listeners:
            assert await listener.next() == paused
        assert not (await store.execution_pause(paused)).changed  # again: no news

        for listener in listeners:
            assert await listener.until_marker() == []
        interrupts = {i.claim.execution_id: i.kind
                      for i in await store.execution_interrupts("worker-a")}
        assert interrupts == {cancelled: "cancel", paused: "pause"}
    finally:
        for listener in listeners:
            await listener.close()


async def test_a_recursive_cancel_notifies_each_running_cancellable_child(
    store: Store, open_extra_store: StoreFactory, raw: RawSQL
) -> None:
    if not store.supports_notifications:
        await assert_not_supported(store)
        return
    listener = Listener(await open_extra_store(), raw, set())
    try:
        await listener.start()
        parent = await submit_unique(store, cancellable=True)
        claim = await claim_exactly(store, parent.id, owner="worker-parent")
        child = new_child(parent.id, cancellable=True)
        stubborn = new_child(parent.id, cancellable=False)  # left to finish: not interrupted
        assert (await store.execution_spawn_if_owned(claim, [child, stubborn], [])).applied
        await claim_exactly(store, child.id, owner="worker-child")
        await claim_exactly(store, stubborn.id, owner="worker-stubborn")

        assert (await store.execution_cancel(parent.id)).changed
        notified = {await listener.next(), await listener.next()}
        assert notified == {parent.id, child.id}
        assert await listener.until_marker() == []
        assert await store.execution_interrupts("worker-stubborn") == []
    finally:
        await listener.close()


async def test_a_lost_listening_connection_ends_the_notifications_with_an_error(
    store: Store, open_extra_store: StoreFactory, raw: RawSQL
) -> None:
    """A worker must learn that it no longer listens (it reconnects), not wait forever."""
    if not store.supports_notifications:
        await assert_not_supported(store)
        return
    listener = Listener(await open_extra_store(), raw, set())
    try:
        await listener.start()
        ended = raw.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query = 'LISTEN veracity_interrupt'")
        assert ended == [(True,)], ended
        with pytest.raises(psycopg.OperationalError):
            await listener.next()
    finally:
        await listener.close()
