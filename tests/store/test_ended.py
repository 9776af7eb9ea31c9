"""Store conformance: which executions have ended (``execution_ended_among``) and the end
signals (``ended_signals``) that wake what waits for them, on every backend: PostgreSQL's
notifications from any store instance; SQLite's commits of this process's stores."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta

from tests.store._support import StoreFactory, claim_exactly, new_execution, unique_ffqn
from veracity.clock import ManualClock
from veracity.models import Claim
from veracity.store import Store

TTL = timedelta(seconds=30)


async def _submitted(store: Store, *, cancellable: bool = False) -> uuid.UUID:
    new = new_execution(unique_ffqn(cancellable=cancellable))
    return (await store.execution_submit(new)).execution.id


async def test_ended_among_names_the_terminal_ones(store: Store, clock: ManualClock) -> None:
    pending = await _submitted(store)
    running = await _submitted(store)
    completed = await _submitted(store)
    failed = await _submitted(store)
    cancelled = await _submitted(store, cancellable=True)
    transient = await _submitted(store)
    await claim_exactly(store, running)
    claim = await claim_exactly(store, completed)
    assert (await store.execution_complete_if_owned(claim, {"ok": 1})).applied
    claim = await claim_exactly(store, failed)
    assert (await store.execution_fail_if_owned(claim, "boom")).applied
    assert (await store.execution_cancel(cancelled)).changed
    await claim_exactly(store, transient, ttl=timedelta(seconds=1))
    clock.advance(2)
    await store.execution_recover_expired(max_attempts=1, limit=10)

    ids = [pending, running, completed, failed, cancelled, transient, uuid.uuid4()]
    assert await store.execution_ended_among(ids) == {completed, failed, cancelled, transient}
    assert await store.execution_ended_among([]) == set()


async def _signalled(store: Store, listener: Store,
                     end: Callable[[], Awaitable[None]]) -> bool:
    woken = asyncio.Event()
    async with listener.ended_signals(woken.set) as alive:
        assert alive()
        await end()
        try:
            await asyncio.wait_for(woken.wait(), 5)
        except TimeoutError:
            return False
        return alive()


async def test_a_completion_signals(store: Store, open_extra_store: StoreFactory) -> None:
    """From another store instance (another process, on PostgreSQL)."""
    other = await open_extra_store()
    ident = await _submitted(store)
    claim = await claim_exactly(store, ident)

    async def complete() -> None:
        assert (await store.execution_complete_if_owned(claim, 1)).applied

    assert await _signalled(store, other, complete)


async def test_a_failure_and_a_cancellation_signal(store: Store) -> None:
    failing = await _submitted(store)
    claim = await claim_exactly(store, failing)
    cancelled = await _submitted(store, cancellable=True)

    async def fail() -> None:
        assert (await store.execution_fail_if_owned(claim, "boom")).applied

    async def cancel() -> None:
        assert (await store.execution_cancel(cancelled)).changed

    assert await _signalled(store, store, fail)
    assert await _signalled(store, store, cancel)


async def test_a_batch_of_completions_signals(store: Store) -> None:
    ids = [await _submitted(store) for _ in range(3)]
    claims: list[Claim] = [await claim_exactly(store, i) for i in ids]

    async def complete_all() -> None:
        results = await store.execution_complete_many_if_owned(
            "worker-a", [(c, n) for n, c in enumerate(claims)])
        assert all(r.applied for r in results)

    assert await _signalled(store, store, complete_all)
    assert await store.execution_ended_among(ids) == set(ids)


async def test_signals_stop_when_the_context_ends(store: Store) -> None:
    calls: list[int] = []
    async with store.ended_signals(lambda: calls.append(1)):
        pass
    ident = await _submitted(store)
    claim = await claim_exactly(store, ident)
    assert (await store.execution_complete_if_owned(claim, 1)).applied
    await asyncio.sleep(0.2)
    assert calls == []
