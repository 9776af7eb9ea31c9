"""Store conformance: the dashboard's reads (status counts, children of many parents,
history by kind) and the operator's reason recorded with cancel, pause, unpause and a
message (docs/dashboard.md)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from tests.store._support import assert_history_consistent, new_execution
from veracity.clock import ManualClock
from veracity.core.states import Status
from veracity.models import Claim
from veracity.store import Store


async def test_counts_in_count_the_statuses_asked_for_terminal_ones_too(store: Store) -> None:
    every = [str(s) for s in Status]
    assert await store.execution_counts_in(every) == {}
    a = (await store.execution_submit(new_execution())).execution
    await store.execution_submit(new_execution())
    c = (await store.execution_submit(new_execution("app.orders.create-cancellable")))
    await store.execution_pause(a.id)
    await store.execution_cancel(c.execution.id)
    assert await store.execution_counts_in(every) == {
        "pending": 1, "paused": 1, "cancelled": 1}
    assert await store.execution_counts_in(["cancelled", "failed"]) == {"cancelled": 1}
    assert await store.execution_counts_in([]) == {}


async def test_children_of_several_parents_by_parent_then_oldest_first(
    store: Store, clock: ManualClock
) -> None:
    p1 = (await store.execution_submit(new_execution())).execution
    p2 = (await store.execution_submit(new_execution())).execution
    lone = (await store.execution_submit(new_execution())).execution
    kids: dict[uuid.UUID, list[uuid.UUID]] = {p1.id: [], p2.id: []}
    for parent in (p1, p2, p1):
        clock.advance(1)
        child = (await store.execution_submit(new_execution(parent_id=parent.id))).execution
        kids[parent.id].append(child.id)
    found = await store.execution_children_of([p1.id, p2.id, lone.id], limit=10)
    by_parent: dict[uuid.UUID | None, list[uuid.UUID]] = {}
    for e in found:
        by_parent.setdefault(e.parent_id, []).append(e.id)
    assert by_parent == kids
    # grouped by parent: each parent's children are contiguous
    parents = [e.parent_id for e in found]
    assert parents == sorted(parents, key=lambda p: parents.index(p))
    assert len(await store.execution_children_of([p1.id, p2.id], limit=2)) == 2
    assert await store.execution_children_of([lone.id], limit=10) == []
    assert await store.execution_children_of([], limit=10) == []


async def test_history_by_kind_pages_in_seq_order(store: Store) -> None:
    e = (await store.execution_submit(new_execution())).execution
    for i in range(5):
        await store.message_send(e.id, f"t{i}", i)
    await store.execution_pause(e.id)
    arrived = await store.history_list_kinds(e.id, ["message_arrived"])
    assert [ev.data["topic"] for ev in arrived] == [f"t{i}" for i in range(5)]
    page = await store.history_list_kinds(e.id, ["message_arrived", "paused"],
                                          after_seq=arrived[2].seq, limit=2)
    assert [ev.seq for ev in page] == [arrived[3].seq, arrived[4].seq]
    rest = await store.history_list_kinds(e.id, ["message_arrived", "paused"],
                                          after_seq=page[-1].seq)
    assert [ev.kind for ev in rest] == ["paused"]
    assert await store.history_list_kinds(e.id, ["completed"]) == []
    assert await store.history_kind_counts(e.id) == {
        "pending": 1, "message_arrived": 5, "paused": 1}
    assert await store.history_kind_counts(uuid.uuid4()) == {}


async def test_reasons_are_recorded_in_the_events(store: Store) -> None:
    e = (await store.execution_submit(new_execution("app.orders.create-cancellable"))).execution
    assert (await store.execution_pause(e.id, actor="ann", reason="<b>hold</b>")).changed
    assert (await store.execution_unpause(e.id, actor="ann", reason="go on")).changed
    sent = await store.message_send(e.id, "approval", True, actor="bob", reason="approved")
    assert sent.changed
    assert (await store.execution_cancel(e.id, actor="cy", reason="not needed")).changed
    events = await assert_history_consistent(store, e.id)
    data = {ev.kind: ev.data for ev in events}
    assert data["paused"] == {"by": "ann", "from": "pending", "reason": "<b>hold</b>"}
    assert data["pending"] == {"by": "ann", "reason": "unpaused: go on"}
    assert data["message_arrived"] == {"message_id": sent.message.id if sent.message else -1,
                                       "topic": "approval", "by": "bob", "reason": "approved"}
    assert data["cancel_requested"] == {"by": "cy", "root": str(e.id), "reason": "not needed"}
    assert (await store.execution_get(e.id)).status == Status.CANCELLED  # type: ignore[union-attr]


async def test_no_reason_leaves_the_events_as_before(store: Store) -> None:
    e = (await store.execution_submit(new_execution())).execution
    await store.execution_pause(e.id, actor="ann")
    await store.execution_unpause(e.id)
    await store.message_send(e.id, "t", None)
    events = await store.history_list(e.id)
    assert events[1].data == {"by": "ann", "from": "pending"}
    assert events[2].data == {"by": None, "reason": "unpaused"}
    assert set(events[3].data) == {"message_id", "topic"}


async def test_a_retry_records_its_reason_in_the_new_executions_first_event(
    store: Store
) -> None:
    old = (await store.execution_submit(new_execution())).execution
    [claimed] = await store.execution_claim("w", [old.ffqn], limit=1,
                                            lease_ttl=timedelta(seconds=30))
    assert (await store.execution_fail_if_owned(
        Claim(claimed.id, "w", claimed.lease_epoch), {"message": "x"})).applied
    retried = await store.execution_retry(old.id, new_execution(), [], actor="ann",
                                          reason="the mail server is back")
    assert retried.execution is not None and retried.changed
    [first] = await store.history_list(retried.execution.id)
    assert first.data["by"] == "ann"
    assert first.data["reason"] == "the mail server is back"
    plain = await store.execution_retry(old.id, new_execution(), [])
    assert plain.execution is not None
    [first] = await store.history_list(plain.execution.id)
    assert "reason" not in first.data
