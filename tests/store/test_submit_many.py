"""Store conformance: batch submission (``execution_submit_many``), on every backend.

One transaction per batch, each item with the idempotency semantics of a single
submission, answered in order; a key reused with a different request refuses the batch
whole, with nothing written.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime, timedelta

import pytest

from tests.store._support import (
    DB_ERRORS,
    RawSQL,
    assert_history_consistent,
    new_execution,
)
from veracity.clock import ManualClock
from veracity.core.states import Status
from veracity.models import BatchConflict, ExecutionFilter
from veracity.store import Store


async def _all_ids(store: Store) -> set[object]:
    return {e.id for e in await store.execution_list(ExecutionFilter(), limit=1000)}


async def test_a_batch_is_stored_in_order_with_first_events(
    store: Store, clock: ManualClock
) -> None:
    later = clock.now() + timedelta(hours=1)
    items = [
        new_execution("app.a", [1, {"x": "ü"}], deployment_id="dep-3"),
        new_execution("app.b", [], idempotency_key="k-1", request_digest="d-1"),
        new_execution("app.c", ["later"], scheduled_at=later),
        dataclasses.replace(new_execution("app.d", [None]), paused=True),
    ]
    answers = await store.execution_submit_many(items)

    assert [a.execution.id for a in answers] == [n.id for n in items]
    assert all(a.created for a in answers)
    assert [a.request_digest for a in answers] == [None, "d-1", None, None]
    first, keyed, scheduled, paused = (a.execution for a in answers)
    assert first.ffqn == "app.a" and first.params == [1, {"x": "ü"}]
    assert first.deployment_id == "dep-3"
    assert first.status == Status.PENDING and first.created_at == clock.now()
    assert first.scheduled_at == clock.now()
    assert keyed.idempotency_key == "k-1"
    assert scheduled.scheduled_at == later
    assert paused.status == Status.PAUSED
    for answer in answers:  # what the batch answered is what is stored
        assert await store.execution_get(answer.execution.id) == answer.execution
    for e in (first, keyed, scheduled):
        (event,) = await assert_history_consistent(store, e.id)
        assert event.kind == "pending" and event.at == clock.now()
        assert event.data["ffqn"] == e.ffqn and event.data["params"] == e.params
        assert event.data["idempotency_key"] == e.idempotency_key
    (event,) = await store.history_list(paused.id)
    assert event.kind == "paused"


async def test_an_empty_batch_writes_nothing(store: Store) -> None:
    assert await store.execution_submit_many([]) == []
    assert await _all_ids(store) == set()


async def test_a_key_repeated_inside_a_batch_names_one_execution(store: Store) -> None:
    a = new_execution("app.a", [1], idempotency_key="k", request_digest="d")
    b = new_execution("app.b", [2])
    again = new_execution("app.a", [1], idempotency_key="k", request_digest="d")
    answers = await store.execution_submit_many([a, b, again])

    assert [s.created for s in answers] == [True, True, False]
    assert answers[2].execution == answers[0].execution
    assert answers[2].execution.id == a.id
    assert answers[2].request_digest == "d"
    assert await _all_ids(store) == {a.id, b.id}
    assert len(await store.history_list(a.id)) == 1


async def test_a_key_stored_before_answers_its_execution(
    store: Store, clock: ManualClock
) -> None:
    stored = (await store.execution_submit(
        new_execution(idempotency_key="k", request_digest="d"))).execution
    clock.advance(3)
    fresh = new_execution(idempotency_key="k2", request_digest="d2")
    repeat = new_execution(idempotency_key="k", request_digest="d")
    answers = await store.execution_submit_many([fresh, repeat])

    assert [s.created for s in answers] == [True, False]
    assert answers[1].execution == stored
    assert answers[1].request_digest == "d"
    assert await _all_ids(store) == {stored.id, fresh.id}
    # and a second batch repeating both answers both, creating nothing
    again = await store.execution_submit_many([
        new_execution(idempotency_key="k2", request_digest="d2"),
        new_execution(idempotency_key="k", request_digest="d")])
    assert [s.created for s in again] == [False, False]
    assert [s.execution.id for s in again] == [fresh.id, stored.id]
    assert await _all_ids(store) == {stored.id, fresh.id}


async def test_a_key_reused_with_another_request_refuses_the_batch_whole(
    store: Store,
) -> None:
    stored = (await store.execution_submit(
        new_execution(idempotency_key="k", request_digest="d"))).execution
    fine = new_execution(idempotency_key="new", request_digest="n")
    other = new_execution(idempotency_key="k", request_digest="not-d")
    with pytest.raises(BatchConflict) as caught:
        await store.execution_submit_many([fine, new_execution(), other])
    assert caught.value.indexes == [2]
    assert caught.value.existing == {2: stored.id}
    assert await _all_ids(store) == {stored.id}  # nothing of the batch was written
    # the keys of the refused batch are free
    assert (await store.execution_submit(fine)).created


async def test_a_key_repeated_inside_a_batch_with_another_request_refuses_it(
    store: Store,
) -> None:
    a = new_execution("app.a", [1], idempotency_key="k", request_digest="d")
    b = new_execution("app.a", [2], idempotency_key="k", request_digest="e")
    with pytest.raises(BatchConflict) as caught:
        await store.execution_submit_many([new_execution(), a, b])
    assert caught.value.indexes == [2]
    assert caught.value.existing == {2: a.id}
    assert await _all_ids(store) == set()


async def test_a_batch_whose_history_insert_fails_writes_nothing(
    store: Store, raw: RawSQL
) -> None:
    items = [new_execution(idempotency_key=f"k{i}") for i in range(3)]
    with raw.history_insert_fails(), pytest.raises(DB_ERRORS, match="boom"):
        await store.execution_submit_many(items)
    assert await _all_ids(store) == set()


async def test_a_thousand_items_in_one_batch(store: Store) -> None:
    items = [new_execution("app.bulk", [i], idempotency_key=f"bulk-{i}", request_digest="d")
             for i in range(1000)]
    answers = await store.execution_submit_many(items)
    assert [a.execution.params for a in answers] == [[i] for i in range(1000)]
    assert all(a.created for a in answers)
    assert len(await _all_ids(store)) == 1000


async def test_child_executions_are_refused_in_a_batch(store: Store) -> None:
    parent = (await store.execution_submit(new_execution())).execution
    child = new_execution(parent_id=parent.id)
    with pytest.raises(ValueError, match="top-level"):
        await store.execution_submit_many([child])
    assert await _all_ids(store) == {parent.id}


async def test_naive_scheduled_at_is_refused(store: Store, clock: ManualClock) -> None:
    naive = clock.now().replace(tzinfo=None)
    with pytest.raises(ValueError):
        await store.execution_submit_many([new_execution(scheduled_at=naive)])
    assert await _all_ids(store) == set()


@pytest.mark.parametrize("micro", [0, 123456], ids=["whole-second", "microseconds"])
async def test_a_batch_writes_the_first_event_a_single_submission_writes(
    store: Store, clock: ManualClock, micro: int
) -> None:
    when = (clock.now() + timedelta(days=2)).replace(microsecond=micro)
    single = new_execution("app.same", [{"b": 1, "a": [None, "ü"]}], idempotency_key="s",
                           scheduled_at=when)
    batched = dataclasses.replace(single, id=uuid.uuid4(), idempotency_key="b")
    await store.execution_submit(single)
    await store.execution_submit_many([batched])
    (one,) = await store.history_list(single.id)
    (other,) = await store.history_list(batched.id)
    assert (other.kind, other.at, other.seq) == (one.kind, one.at, one.seq)
    assert isinstance(one.data, dict) and isinstance(other.data, dict)
    assert {**other.data, "idempotency_key": "s"} == one.data
    assert datetime.fromisoformat(other.data["scheduled_at"]) == when


# -- independent items (all_or_nothing=False: single submissions that share a transaction,
# veracity/grouping.py) -----------------------------------------------------------------


async def test_independent_items_answer_a_reused_key_as_a_single_submission_would(
    store: Store,
) -> None:
    stored = (await store.execution_submit(
        new_execution(idempotency_key="k", request_digest="d"))).execution
    fine = new_execution(idempotency_key="new", request_digest="n")
    plain = new_execution()
    other = new_execution(idempotency_key="k", request_digest="not-d")
    answers = await store.execution_submit_many([fine, plain, other], all_or_nothing=False)

    # the conflicting item refuses nothing: it is answered the stored execution with its
    # digest (the caller compares, as after execution_submit), and the others are written
    assert [a.created for a in answers] == [True, True, False]
    assert answers[2].execution == stored and answers[2].request_digest == "d"
    single = await store.execution_submit(other)
    assert (single.execution, single.created, single.request_digest) == (stored, False, "d")
    assert await _all_ids(store) == {stored.id, fine.id, plain.id}
    for new in (fine, plain):
        (event,) = await assert_history_consistent(store, new.id)
        assert event.kind == "pending"


async def test_independent_items_repeating_a_key_with_another_request(store: Store) -> None:
    a = new_execution("app.a", [1], idempotency_key="k", request_digest="d")
    b = new_execution("app.a", [2], idempotency_key="k", request_digest="e")
    answers = await store.execution_submit_many([a, b], all_or_nothing=False)
    # as if a were submitted, then b: b is answered a's execution and a's digest
    assert [s.created for s in answers] == [True, False]
    assert answers[1].execution.id == a.id and answers[1].request_digest == "d"
    assert await _all_ids(store) == {a.id}


async def test_independent_items_whose_history_insert_fails_write_nothing(
    store: Store, raw: RawSQL
) -> None:
    items = [new_execution(idempotency_key=f"k{i}") for i in range(3)]
    with raw.history_insert_fails(), pytest.raises(DB_ERRORS, match="boom"):
        await store.execution_submit_many(items, all_or_nothing=False)
    assert await _all_ids(store) == set()


@pytest.mark.parametrize("all_or_nothing", [True, False])
async def test_a_write_run_again_after_it_committed_answers_it_created(
        store: Store, all_or_nothing: bool) -> None:
    """What the store does when a connection is lost between a write's commit and its
    answer: it runs the write again from the start (PostgreSQL writes a group of single
    submissions without a transaction around it, each statement committing by itself).
    The same items (the same ids) written again find their own rows: each is answered as
    created, with its row and digest, and nothing is written twice."""
    items = [new_execution(idempotency_key="k1", request_digest="d1"), new_execution(),
             new_execution(idempotency_key="k2", request_digest="d2")]
    first = await store.execution_submit_many(items, all_or_nothing=all_or_nothing)
    again = await store.execution_submit_many(items, all_or_nothing=all_or_nothing)
    assert [a.created for a in again] == [True, True, True]
    assert [a.execution for a in again] == [a.execution for a in first]
    assert [a.request_digest for a in again] == ["d1", items[1].request_digest, "d2"]
    assert await _all_ids(store) == {new.id for new in items}
    for new in items:
        (event,) = await assert_history_consistent(store, new.id)
        assert event.kind == "pending"


PG_ONLY = pytest.mark.parametrize("backend", ["postgresql"], indirect=True)


def _delete_before(monkeypatch: pytest.MonkeyPatch, raw: RawSQL, query: str,
                   key: str) -> list[str]:
    """Run retention's part of the race: just before the store's statement ``query`` (the
    read of the execution a key named), the execution with ``key`` is deleted, as a
    retention pass that committed between the insert and that read. Returns the names of
    the statements run, in order."""
    from veracity.store.postgres import store as pg

    original = pg._q
    seen: list[str] = []

    def q(name: str) -> str:
        seen.append(name)
        if name == query and seen.count(name) == 1:
            ids = raw.execute("SELECT id FROM veracity_executions WHERE idempotency_key = ?",
                              (key,))
            for (ident,) in ids:
                raw.execute("DELETE FROM veracity_history WHERE execution_id = ?", (ident,))
                raw.execute("DELETE FROM veracity_executions WHERE id = ?", (ident,))
        return original(name)

    monkeypatch.setattr(pg, "_q", q)
    return seen


@PG_ONLY
async def test_a_key_whose_execution_retention_deletes_meanwhile_submits_anew(
    store: Store, raw: RawSQL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL inserts, finds the key taken, then reads the execution it names in a
    statement of its own: if retention deleted that execution in between, the key is free
    (docs/operations.md, Retention) and the submission goes again, a new execution, not an
    error. Alone and in a batch."""
    old = await store.execution_submit(new_execution("app.k", [1], idempotency_key="k",
                                                     request_digest="d"))
    seen = _delete_before(monkeypatch, raw, "execution_by_key_or_id", "k")
    again = await store.execution_submit(new_execution("app.k", [1], idempotency_key="k",
                                                       request_digest="d"))
    assert seen.count("execution_submit") == 2  # the second time it inserted
    assert again.created and again.execution.id != old.execution.id
    assert await store.execution_get(old.execution.id) is None

    before = await store.execution_submit_many([new_execution("app.k", [2],
                                                               idempotency_key="b")])
    seen = _delete_before(monkeypatch, raw, "execution_by_keys_or_ids", "b")
    batch = await store.execution_submit_many([
        new_execution("app.k", [2], idempotency_key="b"), new_execution("app.k", [3])])
    assert seen.count("execution_submit_many") == 2
    assert [s.created for s in batch] == [True, True]
    assert batch[0].execution.id != before[0].execution.id
    assert await _all_ids(store) == {again.execution.id, batch[0].execution.id,
                                     batch[1].execution.id}
    for s in batch:
        await assert_history_consistent(store, s.execution.id)
