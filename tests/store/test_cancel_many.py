"""Store conformance: cancelling many executions in one call (``execution_cancel_many``),
each exactly as ``execution_cancel`` would, answered in order (docs/workflows.md).
Runs unchanged against every backend.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

from tests.store._support import (
    StoreFactory,
    assert_history_intact,
    claim_exactly,
    get,
    new_child,
    submit_unique,
)
from tests.store.test_engine_cancel import ended, waiting_parent
from veracity.clock import ManualClock
from veracity.core.states import Status
from veracity.store import Store


async def test_each_id_answered_in_order_as_a_single_cancel_would(
    store: Store, clock: ManualClock
) -> None:
    waiting = await submit_unique(store, cancellable=True)
    running = await submit_unique(store, cancellable=True)
    claim = await claim_exactly(store, running.id)
    done = await ended(store, "completed")
    legacy = await submit_unique(store)  # not -cancellable
    legacy_before = await get(store, legacy.id)
    unknown = uuid.uuid4()
    at = clock.advance(3)

    results = await store.execution_cancel_many(
        [running.id, unknown, waiting.id, legacy.id, done.id, waiting.id], actor="reaper")

    assert len(results) == 6
    r_running, r_unknown, r_waiting, r_legacy, r_done, r_again = results
    # running: cancel requested, its owner is told, it still holds the lease
    got = await get(store, running.id)
    assert r_running.changed and r_running.refused is None and r_running.execution == got
    assert got.status == Status.RUNNING and got.cancel_requested_at == at
    assert [(i.claim, i.kind) for i in await store.execution_interrupts(claim.owner)] == [
        (claim, "cancel")]
    # unknown: no execution
    assert r_unknown.execution is None and not r_unknown.changed
    # waiting: cancelled at once, with the same events as a single cancel
    got = await get(store, waiting.id)
    assert r_waiting.changed and r_waiting.execution == got
    assert got.status == Status.CANCELLED and got.updated_at == at
    events = await assert_history_intact(store, waiting.id)
    assert [(e.kind, e.data) for e in events[-2:]] == [
        ("cancel_requested", {"by": "reaper", "root": str(waiting.id)}),
        ("cancelled", {"by": "reaper", "reason": "cancelled on request"}),
    ]
    # not -cancellable: refused, untouched
    assert r_legacy.refused is not None and r_legacy.code == "not_cancellable"
    assert not r_legacy.changed and r_legacy.execution == legacy_before
    assert await get(store, legacy.id) == legacy_before
    # terminal: unchanged, not refused
    assert not r_done.changed and r_done.refused is None and r_done.execution == done
    assert await get(store, done.id) == done
    # a repeated id is answered as its first occurrence
    assert r_again == r_waiting


async def test_a_repeat_changes_nothing(store: Store, clock: ManualClock) -> None:
    a = await submit_unique(store, cancellable=True)
    b = await submit_unique(store, cancellable=True)
    await claim_exactly(store, b.id)
    first = await store.execution_cancel_many([a.id, b.id])
    assert all(r.changed for r in first)
    before = [await get(store, a.id), await get(store, b.id)]
    clock.advance(1)
    again = await store.execution_cancel_many([a.id, b.id], actor="again")
    assert [r.changed for r in again] == [False, False]
    assert [r.refused for r in again] == [None, None]
    assert [r.execution for r in again] == before
    assert [await get(store, a.id), await get(store, b.id)] == before
    await assert_history_intact(store, a.id)
    await assert_history_intact(store, b.id)


async def test_no_ids_answers_nothing(store: Store) -> None:
    assert await store.execution_cancel_many([]) == []


async def test_a_tree_is_cancelled_as_a_single_cancel_cancels_it(
    store: Store, clock: ManualClock
) -> None:
    """One id with an unfinished -cancellable child (cancelled with its parent), beside one
    without: both in one call."""
    root = await submit_unique(store, cancellable=True)
    child = new_child(root.id, cancellable=True)
    await waiting_parent(store, root.id, [child])
    alone = await submit_unique(store, cancellable=True)
    at = clock.advance(1)
    results = await store.execution_cancel_many([root.id, alone.id], actor="op")
    assert [r.changed for r in results] == [True, True]
    c = await get(store, child.id)
    assert c.status == Status.CANCELLED and c.cancel_requested_at == at
    assert [(e.kind, e.data) for e in (await assert_history_intact(store, child.id))[-2:]] == [
        ("cancel_requested", {"by": "op", "root": str(root.id)}),
        ("cancelled", {"by": "op", "reason": "cancelled with its parent"}),
    ]
    r = await get(store, root.id)
    assert r.status == Status.CANCELLED and results[0].execution == r
    assert (await get(store, alone.id)).status == Status.CANCELLED
    await assert_history_intact(store, root.id)


async def test_overlapping_batches_at_once_each_cancel_once(
    store: Store, open_extra_store: StoreFactory
) -> None:
    """Two connections cancel overlapping sets, given in opposite orders, at once: both
    answer (rows are locked in id order, so neither waits on the other in a cycle), every
    execution is cancelled once, with one pair of events."""
    executions = [await submit_unique(store, cancellable=True) for _ in range(40)]
    ids = [e.id for e in executions]
    one, two = await open_extra_store(), await open_extra_store()
    first, second = await asyncio.gather(
        one.execution_cancel_many(ids[:30], actor="one"),
        two.execution_cancel_many(list(reversed(ids[10:])), actor="two"))
    assert all(r.execution is not None and r.execution.status == Status.CANCELLED
               for r in first + second)
    changed = Counter(r.execution.id for r in first + second if r.changed
                      and r.execution is not None)
    assert sorted(changed) == sorted(ids) and set(changed.values()) == {1}
    for ident in ids:
        events = await assert_history_intact(store, ident)
        assert [e.kind for e in events].count("cancelled") == 1
