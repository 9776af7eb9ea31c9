"""Store conformance: which executions have ended (``execution_ended_among``) and the end
signals (``ended_signals``) that wake what waits for them, on every backend: PostgreSQL's
notifications from any store instance; SQLite's commits of this process's stores."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest

from tests.store._support import (
    StoreFactory,
    claim_exactly,
    new_child,
    new_execution,
    submit_unique,
    unique_ffqn,
)
from tests.store.test_engine_cancel import waiting_parent
from tests.store.test_external import TOKEN, attached, end_action, operator_ends
from veracity.clock import ManualClock
from veracity.core.requests import CallbackReport, InterruptKind
from veracity.core.states import Status
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


# Every statement that ends an execution signals (queries.sql's `ended_note`): a wait on
# GET /v1/executions/{id}?wait= must not depend on its periodic check for any of them.
ENDINGS = ["stopped_by_its_worker_after_a_cancel", "cancelled_with_its_parent",
           "recovered_out_of_attempts", "completed_by_the_engines_callback",
           "ended_by_the_engines_answer", "ended_by_the_reconciler", "forced_by_an_operator"]


async def _ending(store: Store, clock: ManualClock, how: str
                  ) -> tuple[uuid.UUID, Callable[[], Awaitable[None]]]:
    """An unfinished execution and what ends it (by the way named ``how``)."""
    if how == "stopped_by_its_worker_after_a_cancel":
        ex = await submit_unique(store, cancellable=True)
        claim = await claim_exactly(store, ex.id)
        assert (await store.execution_cancel(ex.id)).changed  # asked; still running

        async def end() -> None:
            assert (await store.execution_stop_if_owned(claim, InterruptKind.CANCEL)).applied
        return ex.id, end
    if how == "cancelled_with_its_parent":
        root = await submit_unique(store, cancellable=True)
        child = new_child(root.id, cancellable=True)
        await waiting_parent(store, root.id, [child])

        async def end() -> None:
            (result,) = await store.execution_cancel_many([root.id], actor="op")
            assert result.changed
        return child.id, end
    if how == "recovered_out_of_attempts":
        ex = await submit_unique(store)
        await claim_exactly(store, ex.id, ttl=timedelta(seconds=1))
        clock.advance(2)

        async def end() -> None:
            (recovered,) = await store.execution_recover_expired(max_attempts=1, limit=10)
            assert recovered.execution.id == ex.id
        return ex.id, end
    eid = await attached(store, "run-1")
    if how == "completed_by_the_engines_callback":
        async def end() -> None:
            res = await store.execution_callback(eid, TOKEN, CallbackReport.COMPLETE, 1)
            assert res.outcome == "applied"
    elif how == "ended_by_the_engines_answer":
        async def end() -> None:
            assert (await store.execution_end_external(
                eid, to=Status.FAILED, expected_external_id="run-1")).changed
    elif how == "ended_by_the_reconciler":
        async def end() -> None:
            action = end_action(eid, "run-1", "the engine's run ended")
            assert await store.execution_reconcile_apply([action]) == [action]
    else:
        assert how == "forced_by_an_operator"

        async def end() -> None:
            assert (await operator_ends(store, eid)).changed
    return eid, end


@pytest.mark.parametrize("how", ENDINGS)
async def test_every_way_an_execution_ends_signals(
    store: Store, clock: ManualClock, open_extra_store: StoreFactory, how: str
) -> None:
    """Heard by another store instance (another process, on PostgreSQL)."""
    other = await open_extra_store()
    eid, end = await _ending(store, clock, how)
    assert await store.execution_ended_among([eid]) == set()
    assert await _signalled(store, other, end)
    assert await store.execution_ended_among([eid]) == {eid}


@pytest.mark.parametrize("backend", ["postgresql"])  # SQLite wakes on every commit
async def test_a_write_that_ends_nothing_signals_nothing(store: Store) -> None:
    """What makes the tests above able to fail: on PostgreSQL the signal is the ending
    statement's, not any write's."""
    ex = await submit_unique(store, cancellable=True)
    calls: list[int] = []
    async with store.ended_signals(lambda: calls.append(1)):
        claim = await claim_exactly(store, ex.id)
        assert (await store.execution_cancel(ex.id)).changed  # asked, not ended
        await _submitted(store)
        await asyncio.sleep(0.3)
        assert calls == []
        assert (await store.execution_stop_if_owned(claim, InterruptKind.CANCEL)).applied
        for _ in range(500):
            if calls:
                break
            await asyncio.sleep(0.01)
    assert calls
