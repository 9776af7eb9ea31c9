"""veracity.waiting.EndWaits on both backends: woken by the store's end signals (not by
its periodic check), its check on the clock when the signals are unavailable, release."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

from tests._helpers import store_fixture
from veracity.models import Claim, NewExecution
from veracity.store import Store
from veracity.waiting import EndWaits

store = store_fixture()
TTL = timedelta(seconds=60)


async def _running(store: Store) -> Claim:
    ffqn = f"app.w{uuid.uuid4().hex[:10]}.run"
    new = NewExecution(ffqn=ffqn, params=[], deployment_id="d", id=uuid.uuid4())
    await store.execution_submit(new)
    (claimed,) = await store.execution_claim("w", [ffqn], limit=1, lease_ttl=TTL)
    return Claim(claimed.id, "w", claimed.lease_epoch)


async def _complete_later(store: Store, claim: Claim, delay: float) -> None:
    await asyncio.sleep(delay)
    assert (await store.execution_complete_if_owned(claim, 1)).applied


async def test_a_wait_is_woken_by_the_end_signal(store: Store) -> None:
    waits = EndWaits(store, recheck=60)  # no periodic check within the test
    try:
        claim = await _running(store)
        ender = asyncio.create_task(_complete_later(store, claim, 0.2))
        started = time.monotonic()
        assert await waits.wait(claim.execution_id, 30) is True
        assert time.monotonic() - started < 10
        await ender
    finally:
        await waits.close()


async def test_a_wait_times_out_and_an_ended_one_answers_at_once(store: Store) -> None:
    waits = EndWaits(store, recheck=60)
    try:
        claim = await _running(store)
        assert await waits.wait(claim.execution_id, 0.2) is False
        assert (await store.execution_complete_if_owned(claim, 1)).applied
        assert await waits.wait(claim.execution_id, 30) is True
        assert waits.waiting == 0
    finally:
        await waits.close()


class NoSignals:
    """A store whose end signals cannot be had (as a lost database connection)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def execution_ended_among(self, ids: Any) -> set[uuid.UUID]:
        return await self.store.execution_ended_among(ids)

    @contextlib.asynccontextmanager
    async def ended_signals(self, wake: Callable[[], None]
                            ) -> AsyncIterator[Callable[[], bool]]:
        raise OSError("no connection")
        yield lambda: False  # pragma: no cover - makes this a generator


async def test_without_signals_the_periodic_check_still_ends_a_wait(store: Store) -> None:
    waits = EndWaits(NoSignals(store), recheck=0.1)  # type: ignore[arg-type]
    try:
        claim = await _running(store)
        ender = asyncio.create_task(_complete_later(store, claim, 0.2))
        assert await waits.wait(claim.execution_id, 10) is True
        await ender
    finally:
        await waits.close()


async def test_release_answers_every_waiter_and_takes_no_new_wait(store: Store) -> None:
    waits = EndWaits(store, recheck=60)
    claim = await _running(store)
    task = asyncio.create_task(waits.wait(claim.execution_id, 30))
    while waits.waiting == 0:
        await asyncio.sleep(0.01)
    waits.release()
    assert await asyncio.wait_for(task, 5) is False
    assert await waits.wait(claim.execution_id, 30) is False
    await waits.close()


async def test_the_listener_stops_after_its_linger(store: Store) -> None:
    waits = EndWaits(store, recheck=0.05, linger=0.1)
    claim = await _running(store)
    assert await waits.wait(claim.execution_id, 0.1) is False
    task = waits._task
    assert task is not None
    await asyncio.wait_for(task, 5)  # ends by itself, nobody waiting
    assert await waits.wait(claim.execution_id, 0.1) is False  # and starts again
    await waits.close()
