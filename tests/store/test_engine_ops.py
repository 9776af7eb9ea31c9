"""Store conformance: the durable-engine operations a worker makes (block, spawn, children,
take a message, stop at an interrupt), what operators send (messages), the timer sweep and
the triggers that tell a parent its child ended. Runs unchanged against every backend.

Every refused or fenced write must change nothing but leave a ``late_report`` in history
(docs/states.md, guarantees 2 and 4); every state change appends its event (guarantee 7).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import uuid
from collections.abc import Awaitable
from datetime import datetime, timedelta
from typing import Any, cast

import pytest

from tests.store._support import (
    ENGINE_TTL,
    RawSQL,
    StoreFactory,
    assert_history_intact,
    claim_exactly,
    get,
    kinds,
    new_child,
    submit_unique,
)
from veracity.clock import ManualClock
from veracity.core.requests import InterruptKind
from veracity.core.states import Status
from veracity.models import Claim, Execution, HistoryEvent, Interrupt, TransitionResult
from veracity.store import Store

TTL = ENGINE_TTL

# -- helpers -------------------------------------------------------------------------------


async def running(store: Store, owner: str = "worker-a", **kw: Any) -> Claim:
    ex = await submit_unique(store, **kw)
    return await claim_exactly(store, ex.id, owner)


async def block(
    store: Store, claim: Claim, *, wake_at: datetime | None = None, reason: str = "wait",
    events: list[tuple[str, Any]] | None = None,
) -> Execution:
    """Block with the execution's current signal (nothing missed)."""
    seen = (await get(store, claim.execution_id)).signal_seq
    tr = await store.execution_block_if_owned(
        claim, wake_at=wake_at, seen_signal=seen, events=events or [], reason=reason)
    assert tr.applied and tr.execution is not None
    return tr.execution


async def blocked(store: Store, **kw: Any) -> Execution:
    claim = await running(store, **kw)
    ex = await block(store, claim)
    assert ex.status == Status.BLOCKED
    return ex


async def parent_with_children(
    store: Store, n: int, *, cancellable: bool = False, join_sets: list[str] | None = None,
) -> tuple[Claim, list[uuid.UUID]]:
    """A running parent that has spawned ``n`` pending children."""
    parent = await running(store)
    names = join_sets or ["js0"] * n
    children = [new_child(parent.execution_id, cancellable=cancellable, join_set=names[i])
                for i in range(n)]
    tr = await store.execution_spawn_if_owned(parent, children, [])
    assert tr.applied
    return parent, [c.id for c in children]


async def finish(store: Store, execution_id: uuid.UUID, how: str = "completed") -> None:
    """End an execution the way a worker (or recovery) does."""
    claim = await claim_exactly(store, execution_id, owner=f"worker-{how}")
    if how == "completed":
        assert (await store.execution_complete_if_owned(claim, {"ok": True})).applied
    elif how == "failed":
        assert (await store.execution_fail_if_owned(claim, {"code": "boom"})).applied
    else:
        raise AssertionError(how)


async def late_reports(store: Store, execution_id: uuid.UUID) -> list[HistoryEvent]:
    return [e for e in await store.history_list(execution_id) if e.kind == "late_report"]


LOSSES = ["expired", "wrong_epoch", "wrong_owner", "not_running"]


async def lose_lease(
    store: Store, clock: ManualClock, claim: Claim, how: str
) -> tuple[Claim, str]:
    """A claim that no longer holds the lease, and the reason a refusal must name."""
    if how == "expired":
        clock.advance(TTL)  # lease_expires_at == now: expired
        return claim, "lease expired"
    if how == "wrong_epoch":
        return dataclasses.replace(claim, epoch=claim.epoch + 1), (
            "lease is held by another owner or epoch")
    if how == "wrong_owner":
        return dataclasses.replace(claim, owner="worker-z"), (
            "lease is held by another owner or epoch")
    assert how == "not_running"
    assert (await store.execution_release_if_owned(claim, "gave it back")).applied
    return claim, "execution is pending"


async def assert_refused_and_kept(
    store: Store, before: Execution, result: TransitionResult, *, claim: Claim, report: str,
    reason: str,
) -> HistoryEvent:
    """Nothing changed but one late_report appended (docs/states.md, guarantee 4)."""
    assert result.applied is False
    assert result.reason == reason
    after = await get(store, before.id)
    assert after == dataclasses.replace(before, history_seq=before.history_seq + 1)
    events = await assert_history_intact(store, before.id)
    late = events[-1]
    assert late.kind == "late_report" and late.seq == before.history_seq + 1
    assert late.data["report"] == report
    assert late.data["owner"] == claim.owner and late.data["epoch"] == claim.epoch
    assert late.data["reason"] == reason
    return late


# -- block -----------------------------------------------------------------------------------


async def test_block_moves_running_to_blocked_with_timer_journal_first(
    store: Store, clock: ManualClock
) -> None:
    claim = await running(store)
    at = clock.advance(2)
    wake_at = at + timedelta(minutes=5)
    journal = [("step_completed", {"pos": 0, "result": 41}),
               ("sleep_started", {"pos": 1, "until": wake_at.isoformat()})]
    tr = await store.execution_block_if_owned(
        claim, wake_at=wake_at, seen_signal=0, events=journal, reason="sleep")
    assert tr.applied is True and tr.execution is not None
    ex = await get(store, claim.execution_id)
    assert tr.execution == ex
    assert ex.status == Status.BLOCKED
    assert ex.wake_at == wake_at
    assert ex.lease_owner is None and ex.lease_expires_at is None
    assert ex.lease_epoch == claim.epoch  # the fencing token stays as it was
    assert ex.updated_at == at
    events = await assert_history_intact(store, ex.id)
    assert kinds(events) == ["pending", "running", "step_completed", "sleep_started", "blocked"]
    assert [(e.kind, e.data) for e in events[2:4]] == journal
    assert all(e.at == at for e in events[2:])
    assert events[-1].data == {"reason": "sleep", "owner": claim.owner, "epoch": claim.epoch,
                               "wake_at": wake_at.isoformat()}
    # holds no lease: nobody can claim it, not even its old owner
    assert await store.execution_claim("worker-b", [ex.ffqn], limit=1, lease_ttl=TTL) == []


async def test_block_without_timer_waits_for_a_signal(store: Store) -> None:
    claim = await running(store)
    tr = await store.execution_block_if_owned(
        claim, wake_at=None, seen_signal=0, events=[], reason="recv")
    assert tr.applied and tr.execution is not None
    assert tr.execution.status == Status.BLOCKED and tr.execution.wake_at is None
    events = await assert_history_intact(store, claim.execution_id)
    assert kinds(events) == ["pending", "running", "blocked"]
    assert events[-1].data == {"reason": "recv", "owner": claim.owner, "epoch": claim.epoch}


async def test_block_goes_pending_when_the_signal_moved(store: Store, clock: ManualClock) -> None:
    claim = await running(store)
    seen = (await get(store, claim.execution_id)).signal_seq
    sent = await store.message_send(claim.execution_id, "t", {"m": 1})  # while it runs
    assert sent.changed
    at = clock.advance(1)
    wake_at = at + timedelta(hours=1)
    tr = await store.execution_block_if_owned(
        claim, wake_at=wake_at, seen_signal=seen, events=[("recv_started", {"pos": 0})],
        reason="recv")
    assert tr.applied and tr.execution is not None
    ex = await get(store, claim.execution_id)
    assert ex.status == Status.PENDING
    assert ex.wake_at is None and ex.lease_owner is None and ex.updated_at == at
    events = await assert_history_intact(store, ex.id)
    assert kinds(events) == ["pending", "running", "message_arrived", "recv_started", "pending"]
    assert events[-1].data["woken"] == "signalled"
    assert events[-1].data["reason"] == "recv"
    # claimable again at once
    again = await claim_exactly(store, ex.id, "worker-b")
    assert again.epoch == claim.epoch + 1


@pytest.mark.parametrize("due_in", [timedelta(0), timedelta(seconds=-5)], ids=["now", "past"])
async def test_block_goes_pending_when_the_timer_is_already_due(
    store: Store, clock: ManualClock, due_in: timedelta
) -> None:
    claim = await running(store)
    at = clock.advance(3)
    tr = await store.execution_block_if_owned(
        claim, wake_at=at + due_in, seen_signal=0, events=[], reason="sleep")
    assert tr.applied and tr.execution is not None
    ex = await get(store, claim.execution_id)
    assert ex.status == Status.PENDING and ex.wake_at is None and ex.lease_owner is None
    events = await assert_history_intact(store, ex.id)
    assert kinds(events) == ["pending", "running", "pending"]
    assert events[-1].data["woken"] == "already due"


async def test_block_just_before_the_timer_blocks(store: Store, clock: ManualClock) -> None:
    claim = await running(store)
    wake_at = clock.now() + timedelta(microseconds=1)
    tr = await store.execution_block_if_owned(
        claim, wake_at=wake_at, seen_signal=0, events=[], reason="sleep")
    assert tr.execution is not None and tr.execution.status == Status.BLOCKED
    assert tr.execution.wake_at == wake_at


@pytest.mark.parametrize("how", LOSSES)
async def test_block_without_the_lease_is_refused_and_kept(
    store: Store, clock: ManualClock, how: str
) -> None:
    claim = await running(store)
    stale, reason = await lose_lease(store, clock, claim, how)
    before = await get(store, claim.execution_id)
    tr = await store.execution_block_if_owned(
        stale, wake_at=clock.now() + timedelta(hours=1), seen_signal=0,
        events=[("sleep_started", {"pos": 0})], reason="sleep")
    late = await assert_refused_and_kept(store, before, tr, claim=stale, report="block",
                                         reason=reason)
    assert late.data["payload"] == {"reason": "sleep"}
    assert "sleep_started" not in kinds(await store.history_list(claim.execution_id))


async def test_block_twice_second_is_refused(store: Store) -> None:
    claim = await running(store)
    await block(store, claim)
    before = await get(store, claim.execution_id)
    tr = await store.execution_block_if_owned(
        claim, wake_at=None, seen_signal=0, events=[], reason="again")
    await assert_refused_and_kept(store, before, tr, claim=claim, report="block",
                                  reason="execution is blocked")


@pytest.mark.parametrize("kind", ["blocked", "pending", "completed", "late_report", ""])
async def test_block_rejects_state_names_as_journal_kinds(store: Store, kind: str) -> None:
    claim = await running(store)
    before = await get(store, claim.execution_id)
    with pytest.raises(ValueError):
        await store.execution_block_if_owned(
            claim, wake_at=None, seen_signal=0, events=[(kind, {})], reason="x")
    assert await get(store, claim.execution_id) == before


async def test_block_rejects_a_naive_wake_time(store: Store) -> None:
    claim = await running(store)
    with pytest.raises(ValueError, match="naive"):
        await store.execution_block_if_owned(
            claim, wake_at=datetime(2031, 1, 1), seen_signal=0, events=[], reason="x")
    assert (await get(store, claim.execution_id)).status == Status.RUNNING


# -- timers ----------------------------------------------------------------------------------


async def test_wake_due_moves_due_blocked_executions_to_pending(
    store: Store, clock: ManualClock
) -> None:
    t0 = clock.now()
    first = await running(store)
    await block(store, first, wake_at=t0 + timedelta(seconds=10))
    second = await running(store)
    await block(store, second, wake_at=t0 + timedelta(seconds=20))
    forever = await running(store)
    await block(store, forever)  # no timer

    assert await store.execution_wake_due() == []
    at = clock.advance(10)  # exactly due
    woken = await store.execution_wake_due()
    assert [e.id for e in woken] == [first.execution_id]
    ex = await get(store, first.execution_id)
    assert woken[0] == ex
    assert ex.status == Status.PENDING and ex.wake_at is None and ex.updated_at == at
    events = await assert_history_intact(store, ex.id)
    assert events[-1].kind == "pending" and events[-1].data == {"reason": "timer"}
    assert (await get(store, second.execution_id)).status == Status.BLOCKED

    clock.advance(timedelta(days=1))
    assert [e.id for e in await store.execution_wake_due()] == [second.execution_id]
    assert (await get(store, forever.execution_id)).status == Status.BLOCKED
    assert await store.execution_wake_due() == []
    for c in (first, second, forever):
        await assert_history_intact(store, c.execution_id)
    await claim_exactly(store, first.execution_id, "worker-b")


async def test_wake_due_respects_limit_oldest_timer_first(
    store: Store, clock: ManualClock
) -> None:
    t0 = clock.now()
    claims = [await running(store) for _ in range(3)]
    for c, s in zip(claims, (30, 10, 20), strict=True):
        await block(store, c, wake_at=t0 + timedelta(seconds=s))
    clock.advance(60)
    assert [e.id for e in await store.execution_wake_due(limit=2)] == [
        claims[1].execution_id, claims[2].execution_id]
    assert [e.id for e in await store.execution_wake_due(limit=2)] == [claims[0].execution_id]


async def test_wake_due_leaves_paused_executions_alone(store: Store, clock: ManualClock) -> None:
    claim = await running(store)
    await block(store, claim, wake_at=clock.now() + timedelta(seconds=5))
    assert (await store.execution_pause(claim.execution_id)).changed
    clock.advance(60)
    assert await store.execution_wake_due() == []
    assert (await get(store, claim.execution_id)).status == Status.PAUSED


# -- spawn -----------------------------------------------------------------------------------


async def test_spawn_inserts_children_and_the_parents_journal(
    store: Store, clock: ManualClock
) -> None:
    parent = await running(store)
    before = await get(store, parent.execution_id)
    at = clock.advance(4)
    kids = [new_child(parent.execution_id, params=[1, {"a": "ü"}], deployment_id="dep-2"),
            new_child(parent.execution_id, join_set="js1", params=[])]
    journal = [("child_submitted", {"pos": i, "child_id": str(k.id)}) for i, k in enumerate(kids)]
    tr = await store.execution_spawn_if_owned(parent, kids, journal)
    assert tr.applied is True

    for k in kids:
        child = await get(store, k.id)
        assert child.status == Status.PENDING
        assert (child.ffqn, child.params, child.deployment_id) == (k.ffqn, k.params,
                                                                   k.deployment_id)
        assert child.parent_id == parent.execution_id and child.join_set == k.join_set
        assert child.attempt == 1 and child.lease_owner is None and child.lease_epoch == 0
        assert child.created_at == child.updated_at == child.scheduled_at == at
        events = await assert_history_intact(store, k.id)
        assert len(events) == 1 and events[0].at == at
        assert events[0].data["parent_id"] == str(parent.execution_id)
        assert events[0].data["join_set"] == k.join_set
        assert events[0].data["created_by"] == str(parent.execution_id)
        assert events[0].data["ffqn"] == k.ffqn and events[0].data["params"] == k.params
    # the parent keeps running with its lease; only its journal grew
    after = await get(store, parent.execution_id)
    assert after == dataclasses.replace(before, history_seq=before.history_seq + 2)
    events = await assert_history_intact(store, parent.execution_id)
    assert [(e.kind, e.data) for e in events[2:]] == journal
    # the children are claimable by any worker
    await claim_exactly(store, kids[0].id, "worker-b")


async def test_spawn_the_same_child_again_inserts_nothing(store: Store) -> None:
    parent = await running(store)
    kid = new_child(parent.execution_id)
    assert (await store.execution_spawn_if_owned(parent, [kid], [("child_submitted", {})])).applied
    first = await get(store, kid.id)
    # a replay after a crash spawns the same id again (even with a different body)
    again = dataclasses.replace(kid, params=["other"], join_set="js9")
    tr = await store.execution_spawn_if_owned(parent, [again], [("child_submitted", {"n": 2})])
    assert tr.applied is True
    assert await get(store, kid.id) == first
    assert len(await store.history_list(kid.id)) == 1
    children, _ = await store.execution_children(parent.execution_id)
    assert [c.id for c in children] == [kid.id]
    events = await assert_history_intact(store, parent.execution_id)
    assert kinds(events) == ["pending", "running", "child_submitted", "child_submitted"]


async def test_spawn_of_many_at_once_creates_each_new_one_once(
    store: Store, clock: ManualClock
) -> None:
    """A reconciler schedules thousands in one write (docs/generations.md): every new one is
    created with its event, one already there is left as it is, and the parent's journal
    gets every event in order."""
    parent = await running(store)
    existing = new_child(None, params=["k-old"])
    assert (await store.execution_spawn_if_owned(parent, [existing], [])).applied
    first = await get(store, existing.id)
    at = clock.advance(2)
    later = at + timedelta(hours=1)
    kids = [new_child(None if i % 3 else parent.execution_id, params=[f"k{i}", {"n": i}],
                      join_set=None if i % 3 else f"js{i}",
                      scheduled_at=later if i % 7 == 0 else None) for i in range(500)]
    journal = [("scheduled", {"pos": i, "execution_id": str(k.id)}) for i, k in enumerate(kids)]
    again = dataclasses.replace(existing, params=["changed"])
    tr = await store.execution_spawn_if_owned(parent, [*kids, again], journal)
    assert tr.applied is True
    assert await get(store, existing.id) == first
    assert len(await store.history_list(existing.id)) == 1
    for i, k in enumerate(kids):
        child = await get(store, k.id)
        assert (child.status, child.ffqn, child.params, child.parent_id, child.join_set) == (
            Status.PENDING, k.ffqn, [f"k{i}", {"n": i}], k.parent_id, k.join_set)
        assert child.scheduled_at == (later if i % 7 == 0 else at)
        assert child.created_at == at
        [event] = await store.history_list(k.id)
        assert (event.seq, event.kind, event.at) == (1, "pending", at)
        assert event.data["created_by"] == str(parent.execution_id)
        assert event.data["params"] == k.params
    events = await assert_history_intact(store, parent.execution_id)
    assert [(e.kind, e.data) for e in events[2:]] == journal


@pytest.mark.parametrize("how", LOSSES)
async def test_spawn_without_the_lease_inserts_nothing(
    store: Store, clock: ManualClock, raw: RawSQL, how: str
) -> None:
    parent = await running(store)
    stale, reason = await lose_lease(store, clock, parent, how)
    before = await get(store, parent.execution_id)
    kids = [new_child(parent.execution_id), new_child(None)]
    tr = await store.execution_spawn_if_owned(stale, kids, [("child_submitted", {"pos": 0})])
    late = await assert_refused_and_kept(store, before, tr, claim=stale, report="spawn",
                                         reason=reason)
    assert late.data["payload"] == {"children": [str(k.id) for k in kids]}
    for k in kids:
        assert await store.execution_get(k.id) is None
    assert raw.scalar("SELECT count(*) FROM veracity_executions") == 1


async def test_spawn_without_children_writes_the_journal_only(store: Store) -> None:
    parent = await running(store)
    before = await get(store, parent.execution_id)
    tr = await store.execution_spawn_if_owned(parent, [], [("scheduled", {"pos": 0})])
    assert tr.applied
    assert await get(store, parent.execution_id) == dataclasses.replace(
        before, history_seq=before.history_seq + 1)
    events = await assert_history_intact(store, parent.execution_id)
    assert kinds(events) == ["pending", "running", "scheduled"]
    # and with nothing at all, nothing happens
    assert (await store.execution_spawn_if_owned(parent, [], [])).applied
    assert len(await store.history_list(parent.execution_id)) == 3


async def test_spawn_creates_top_level_executions(store: Store, clock: ManualClock) -> None:
    parent = await running(store)
    later = clock.now() + timedelta(minutes=1)
    top = new_child(None, scheduled_at=later)
    assert (await store.execution_spawn_if_owned(parent, [top], [("scheduled", {})])).applied
    ex = await get(store, top.id)
    assert ex.status == Status.PENDING and ex.parent_id is None and ex.join_set is None
    assert ex.scheduled_at == later
    events = await assert_history_intact(store, top.id)
    assert events[0].data["parent_id"] is None
    assert await store.execution_children(parent.execution_id) == ([], 0)
    # scheduled for later: not claimable before then
    assert await store.execution_claim("w", [top.ffqn], limit=1, lease_ttl=TTL) == []
    clock.set(later)
    await claim_exactly(store, top.id, "w")
    # ending it does not signal whoever created it
    await store.execution_complete_if_owned(Claim(top.id, "w", 1), None)
    assert (await get(store, parent.execution_id)).signal_seq == 0


async def test_spawn_rejects_state_names_as_journal_kinds(store: Store) -> None:
    parent = await running(store)
    kid = new_child(parent.execution_id)
    with pytest.raises(ValueError):
        await store.execution_spawn_if_owned(parent, [kid], [("cancelled", {})])
    assert await store.execution_get(kid.id) is None


# -- children --------------------------------------------------------------------------------


async def test_children_ended_first_in_the_order_they_ended(
    store: Store, clock: ManualClock
) -> None:
    parent, ids = await parent_with_children(
        store, 5, join_sets=["js0", "js0", "js0", "js0", "js1"])
    a, b, c, d, e = ids
    clock.advance(1)
    await finish(store, c, "completed")
    clock.advance(1)
    await finish(store, e, "failed")
    clock.advance(1)
    await finish(store, a, "failed")
    children, signal = await store.execution_children(parent.execution_id)
    assert [x.id for x in children[:3]] == [c, e, a]
    assert {x.id for x in children[3:]} == {b, d}
    assert [x.status for x in children] == [Status.COMPLETED, Status.FAILED, Status.FAILED,
                                            Status.PENDING, Status.PENDING]
    assert signal == 3 == (await get(store, parent.execution_id)).signal_seq

    js0, signal0 = await store.execution_children(parent.execution_id, "js0")
    assert [x.id for x in js0[:2]] == [c, a] and {x.id for x in js0[2:]} == {b, d}
    assert signal0 == 3
    js1, _ = await store.execution_children(parent.execution_id, "js1")
    assert [x.id for x in js1] == [e]
    assert await store.execution_children(parent.execution_id, "nope") == ([], 3)


async def test_children_of_an_unknown_or_childless_execution(store: Store) -> None:
    assert await store.execution_children(uuid.uuid4()) == ([], 0)
    lone = await submit_unique(store)
    assert await store.execution_children(lone.id) == ([], 0)


async def test_children_signal_lets_a_parent_block_without_missing_an_end(
    store: Store, clock: ManualClock
) -> None:
    parent, (kid,) = await parent_with_children(store, 1)
    children, signal = await store.execution_children(parent.execution_id)
    assert [x.status for x in children] == [Status.PENDING]
    await finish(store, kid)  # ends between the parent's read and its block
    tr = await store.execution_block_if_owned(
        parent, wake_at=None, seen_signal=signal, events=[], reason="join")
    assert tr.execution is not None and tr.execution.status == Status.PENDING
    children, signal2 = await store.execution_children(parent.execution_id)
    assert signal2 == signal + 1 and children[0].status == Status.COMPLETED


# -- triggers: a child ends ------------------------------------------------------------------


CHILD_ENDS = ["completed", "failed", "failed_transient", "lease_expired", "cancelled"]


async def end_child(store: Store, clock: ManualClock, child_id: uuid.UUID, how: str) -> Status:
    if how in ("completed", "failed"):
        await finish(store, child_id, how)
        return Status(how)
    if how == "failed_transient":
        c = await claim_exactly(store, child_id, "worker-t")
        assert (await store.execution_fail_if_owned(c, {"code": "x"}, transient=True)).applied
        return Status.FAILED_TRANSIENT
    if how == "lease_expired":  # recovery gives up on it
        await claim_exactly(store, child_id, "worker-dead")
        clock.advance(TTL)
        recovered = await store.execution_recover_expired(max_attempts=1)
        assert [r.execution.id for r in recovered] == [child_id]
        return Status.FAILED_TRANSIENT
    assert how == "cancelled"
    result = await store.execution_cancel(child_id, actor="op")
    assert result.changed
    return Status.CANCELLED


@pytest.mark.parametrize("how", CHILD_ENDS)
async def test_a_child_ending_wakes_its_blocked_parent(
    store: Store, clock: ManualClock, how: str
) -> None:
    parent, (kid, other) = await parent_with_children(store, 2, cancellable=True)
    await block(store, parent, wake_at=clock.now() + timedelta(days=1))
    before = await get(store, parent.execution_id)
    status = await end_child(store, clock, kid, how)
    child = await get(store, kid)
    assert child.status == status
    ex = await get(store, parent.execution_id)
    assert ex.status == Status.PENDING
    assert ex.signal_seq == before.signal_seq + 1
    assert ex.wake_at is None and ex.updated_at == child.updated_at
    events = await assert_history_intact(store, parent.execution_id)
    assert events[-1].kind == "pending" and events[-1].seq == before.history_seq + 1
    assert events[-1].data == {"reason": "child ended", "child_id": str(kid),
                               "child_status": str(status)}
    await assert_history_intact(store, kid)
    # the other child ending later only moves the (now pending) parent's signal
    await finish(store, other)
    again = await get(store, parent.execution_id)
    assert again.status == Status.PENDING and again.signal_seq == ex.signal_seq + 1
    assert again.history_seq == ex.history_seq


async def test_a_child_ending_only_signals_a_running_parent(store: Store) -> None:
    parent, (kid,) = await parent_with_children(store, 1)
    before = await get(store, parent.execution_id)
    await finish(store, kid)
    after = await get(store, parent.execution_id)
    assert after == dataclasses.replace(before, signal_seq=before.signal_seq + 1)
    # the parent still holds its lease and can write
    assert (await store.execution_checkpoint_if_owned(parent, "step_completed", {})).applied


async def test_a_child_ending_leaves_a_paused_parent_paused(
    store: Store, clock: ManualClock
) -> None:
    parent, (kid,) = await parent_with_children(store, 1)
    await block(store, parent)
    assert (await store.execution_pause(parent.execution_id)).changed
    before = await get(store, parent.execution_id)
    await finish(store, kid)
    after = await get(store, parent.execution_id)
    assert after == dataclasses.replace(before, signal_seq=before.signal_seq + 1)
    # unpaused, it no longer waits: something happened while it was paused
    result = await store.execution_unpause(parent.execution_id)
    assert result.execution is not None and result.execution.status == Status.PENDING
    await assert_history_intact(store, parent.execution_id)


async def test_a_child_ending_after_its_parent_ended_changes_nothing(store: Store) -> None:
    parent, (kid,) = await parent_with_children(store, 1)
    assert (await store.execution_complete_if_owned(parent, "done early")).applied
    before = await get(store, parent.execution_id)
    await finish(store, kid)
    assert await get(store, parent.execution_id) == before


# -- messages --------------------------------------------------------------------------------


async def test_message_to_a_pending_or_running_execution_is_stored(
    store: Store, clock: ManualClock
) -> None:
    pending = await submit_unique(store)
    claim = await running(store)
    for execution_id, status in ((pending.id, Status.PENDING),
                                 (claim.execution_id, Status.RUNNING)):
        before = await get(store, execution_id)
        at = clock.advance(1)
        result = await store.message_send(execution_id, "approval", {"ok": True, "n": [1]})
        assert result.changed is True and result.refused is None
        m = result.message
        assert m is not None
        assert (m.execution_id, m.topic, m.payload) == (execution_id, "approval",
                                                        {"ok": True, "n": [1]})
        assert m.created_at == at and m.consumed_at is None and m.consumed_pos is None
        after = await get(store, execution_id)
        assert result.execution == after
        assert after == dataclasses.replace(before, signal_seq=before.signal_seq + 1,
                                            history_seq=before.history_seq + 1)
        assert after.status == status
        events = await assert_history_intact(store, execution_id)
        assert events[-1].kind == "message_arrived" and events[-1].at == at
        assert events[-1].data == {"message_id": m.id, "topic": "approval"}


async def test_message_wakes_a_blocked_execution(store: Store, clock: ManualClock) -> None:
    claim = await running(store)
    await block(store, claim, wake_at=clock.now() + timedelta(hours=1))
    before = await get(store, claim.execution_id)
    at = clock.advance(5)
    result = await store.message_send(claim.execution_id, "go", "payload")
    assert result.changed and result.message is not None
    ex = await get(store, claim.execution_id)
    assert result.execution == ex
    assert ex.status == Status.PENDING and ex.wake_at is None and ex.updated_at == at
    assert ex.signal_seq == before.signal_seq + 1
    events = await assert_history_intact(store, ex.id)
    assert kinds(events)[-2:] == ["message_arrived", "pending"]
    assert events[-1].data == {"reason": "message arrived", "topic": "go"}
    # the worker that claims it next takes the message
    again = await claim_exactly(store, ex.id, "worker-b")
    taken = await store.execution_take_message_if_owned(again, "go", 0)
    assert taken.message is not None and taken.message.id == result.message.id


async def test_message_to_a_paused_execution_is_kept_for_later(store: Store) -> None:
    claim = await running(store)
    await block(store, claim)
    assert (await store.execution_pause(claim.execution_id)).changed
    before = await get(store, claim.execution_id)
    result = await store.message_send(claim.execution_id, "go", 1)
    assert result.changed and result.message is not None
    ex = await get(store, claim.execution_id)
    assert ex.status == Status.PAUSED and ex.signal_seq == before.signal_seq + 1
    unpaused = await store.execution_unpause(claim.execution_id)
    assert unpaused.execution is not None and unpaused.execution.status == Status.PENDING
    await assert_history_intact(store, claim.execution_id)


@pytest.mark.parametrize("end", ["completed", "failed", "cancelled"])
async def test_message_to_a_terminal_execution_is_refused_and_not_stored(
    store: Store, raw: RawSQL, end: str
) -> None:
    if end == "cancelled":
        ex = await submit_unique(store, cancellable=True)
        assert (await store.execution_cancel(ex.id)).changed
        execution_id = ex.id
    else:
        claim = await running(store)
        execution_id = claim.execution_id
        await (store.execution_complete_if_owned(claim, 1) if end == "completed"
               else store.execution_fail_if_owned(claim, {"e": 1}))
    before = await get(store, execution_id)
    result = await store.message_send(execution_id, "late", {"x": 1})
    assert result.refused is not None and end in result.refused
    assert result.changed is False and result.message is None
    assert result.execution == before
    assert await get(store, execution_id) == before
    assert raw.scalar("SELECT count(*) FROM veracity_messages") == 0


async def test_message_to_an_unknown_execution(store: Store, raw: RawSQL) -> None:
    result = await store.message_send(uuid.uuid4(), "t", 1)
    assert result.execution is None and result.changed is False and result.message is None
    assert raw.scalar("SELECT count(*) FROM veracity_messages") == 0


async def test_take_message_takes_the_oldest_unread_of_its_topic_once(
    store: Store, clock: ManualClock, raw: RawSQL
) -> None:
    claim = await running(store)
    m1 = (await store.message_send(claim.execution_id, "a", {"n": 1})).message
    m2 = (await store.message_send(claim.execution_id, "b", {"n": 2})).message
    m3 = (await store.message_send(claim.execution_id, "a", [3])).message
    assert m1 is not None and m2 is not None and m3 is not None
    signal = (await get(store, claim.execution_id)).signal_seq
    assert signal == 3

    at = clock.advance(1)
    t1 = await store.execution_take_message_if_owned(claim, "a", 7)
    assert t1.applied and t1.signal_seq == signal
    assert t1.message is not None
    assert (t1.message.id, t1.message.topic, t1.message.payload) == (m1.id, "a", {"n": 1})
    t2 = await store.execution_take_message_if_owned(claim, "a", 9)
    assert t2.applied and t2.message is not None and t2.message.id == m3.id
    t3 = await store.execution_take_message_if_owned(claim, "a", 11)
    assert t3.applied is True and t3.message is None and t3.signal_seq == signal
    t4 = await store.execution_take_message_if_owned(claim, "b", 12)
    assert t4.message is not None and t4.message.id == m2.id
    assert (await store.execution_take_message_if_owned(claim, "c", 13)).message is None

    events = await assert_history_intact(store, claim.execution_id)
    received = [e for e in events if e.kind == "message_received"]
    assert [e.data for e in received] == [
        {"pos": 7, "topic": "a", "message_id": m1.id, "payload": {"n": 1}},
        {"pos": 9, "topic": "a", "message_id": m3.id, "payload": [3]},
        {"pos": 12, "topic": "b", "message_id": m2.id, "payload": {"n": 2}},
    ]
    assert all(e.at == at for e in received)
    rows = raw.execute("SELECT id, consumed_pos FROM veracity_messages ORDER BY id")
    assert [(int(i), p) for i, p in rows] == [(m1.id, 7), (m2.id, 12), (m3.id, 9)]
    # the execution is still running with its lease; taking changed no state
    ex = await get(store, claim.execution_id)
    assert ex.status == Status.RUNNING and ex.lease_owner == claim.owner


@pytest.mark.parametrize("how", LOSSES)
async def test_take_message_without_the_lease_is_refused_and_kept(
    store: Store, clock: ManualClock, how: str
) -> None:
    claim = await running(store)
    sent = (await store.message_send(claim.execution_id, "a", "hello")).message
    assert sent is not None
    stale, reason = await lose_lease(store, clock, claim, how)
    before = await get(store, claim.execution_id)
    taken = await store.execution_take_message_if_owned(stale, "a", 3)
    assert taken.applied is False and taken.message is None
    assert taken.signal_seq == before.signal_seq
    late = (await late_reports(store, claim.execution_id))[-1]
    assert late.data["report"] == "receive" and late.data["reason"] == reason
    assert late.data["payload"] == {"topic": "a", "pos": 3}
    assert await get(store, claim.execution_id) == dataclasses.replace(
        before, history_seq=before.history_seq + 1)
    await assert_history_intact(store, claim.execution_id)
    # the message was not consumed: the next owner gets it
    if how in ("expired", "not_running"):
        if how == "expired":
            await store.execution_recover_expired(max_attempts=5)
        again = await claim_exactly(store, claim.execution_id, "worker-b")
        got = await store.execution_take_message_if_owned(again, "a", 3)
        assert got.message is not None and got.message.id == sent.id


async def test_concurrent_takes_never_deliver_a_message_twice(
    store: Store, open_extra_store: StoreFactory
) -> None:
    other = await open_extra_store()
    claim = await running(store)
    sent = []
    for i in range(12):
        m = (await store.message_send(claim.execution_id, "jobs", {"i": i})).message
        assert m is not None
        sent.append(m.id)
    positions = itertools.count()

    async def taker(s: Store) -> list[int]:
        got: list[int] = []
        for _ in range(9):
            taken = await s.execution_take_message_if_owned(claim, "jobs", next(positions))
            assert taken.applied
            if taken.message is not None:
                got.append(taken.message.id)
        return got

    got = await asyncio.gather(taker(store), taker(other), taker(store), taker(other))
    everything = [m for one in got for m in one]
    assert sorted(everything) == sent  # each exactly once
    events = await assert_history_intact(store, claim.execution_id)
    received = [e.data["message_id"] for e in events if e.kind == "message_received"]
    assert sorted(received) == sent


# -- stop at an interrupt --------------------------------------------------------------------


async def test_stop_pause_parks_a_running_execution(store: Store, clock: ManualClock) -> None:
    claim = await running(store)
    assert (await store.execution_pause(claim.execution_id, actor="op")).changed
    at = clock.advance(2)
    tr = await store.execution_stop_if_owned(claim, InterruptKind.PAUSE)
    assert tr.applied and tr.execution is not None
    ex = await get(store, claim.execution_id)
    assert tr.execution == ex
    assert ex.status == Status.PAUSED and ex.paused_from == "pending"
    assert ex.lease_owner is None and ex.lease_expires_at is None
    assert ex.pause_requested_at is None and ex.updated_at == at
    events = await assert_history_intact(store, ex.id)
    assert kinds(events) == ["pending", "running", "pause_requested", "paused"]
    assert events[-1].data["owner"] == claim.owner and events[-1].data["epoch"] == claim.epoch
    assert await store.execution_claim("w", [ex.ffqn], limit=1, lease_ttl=TTL) == []
    assert await store.execution_interrupts(claim.owner) == []
    unpaused = await store.execution_unpause(ex.id)
    assert unpaused.execution is not None and unpaused.execution.status == Status.PENDING
    await claim_exactly(store, ex.id, "worker-b")


async def test_stop_pause_after_the_pause_was_withdrawn_gives_the_run_back(
    store: Store,
) -> None:
    """Guards the withdrawn-pause path of the stop operation (store/_ops.py stop_if_owned):
    the worker acts on a pause that the operator withdrew meanwhile; the execution goes back
    to pending (to resume from its journal) and the write says it was applied, so the
    worker does not take a state change that happened for a refused one."""
    claim = await running(store)
    assert (await store.execution_pause(claim.execution_id, actor="op")).changed
    assert (await store.execution_unpause(claim.execution_id, actor="op")).changed
    tr = await store.execution_stop_if_owned(claim, InterruptKind.PAUSE)
    assert tr.applied is True
    ex = await get(store, claim.execution_id)
    assert tr.execution == ex
    assert ex.status == Status.PENDING and ex.lease_owner is None
    events = await assert_history_intact(store, ex.id)
    assert events[-1].kind == "pending"
    assert events[-1].data["reason"] == "pause withdrawn before it parked"
    assert events[-1].data["owner"] == claim.owner


async def test_blocking_with_journal_events_after_a_pause_request_keeps_them_in_order(
    store: Store, clock: ManualClock
) -> None:
    """Guards the pause branch of the block operation (store/_ops.py block_if_owned): the
    journal events written with the wait come first, then the ``paused`` event, each with
    the next sequence number, so a resumed run replays them in order."""
    claim = await running(store)
    assert (await store.execution_pause(claim.execution_id, actor="op")).changed
    journal = [("step_completed", {"pos": 0, "name": "a", "result": 1}),
               ("step_completed", {"pos": 1, "name": "b", "result": 2})]
    tr = await store.execution_block_if_owned(
        claim, wake_at=clock.now() + timedelta(hours=1), seen_signal=0, events=journal,
        reason="sleep")
    assert tr.applied and tr.execution is not None
    assert tr.execution.status == Status.PAUSED
    events = await assert_history_intact(store, claim.execution_id)
    assert kinds(events)[-3:] == ["step_completed", "step_completed", "paused"]
    assert [e.data.get("name") for e in events[-3:-1]] == ["a", "b"]
    assert events[-1].data["reason"] == "pause requested; parked at its wait (sleep)"


async def test_fenced_operations_on_an_unknown_execution_are_refused(store: Store) -> None:
    """Guards the refusal path of every fenced operation of store/_ops.py (block, spawn,
    take a message, stop): for an execution that does not exist, the answer is "not
    applied", saying so, and nothing is written (the spawned child is not created)."""
    ghost = Claim(uuid.uuid4(), "worker-a", 1)
    child = new_child(ghost.execution_id)
    refused = [
        await store.execution_block_if_owned(ghost, wake_at=None, seen_signal=0, events=[],
                                             reason="wait"),
        await store.execution_spawn_if_owned(ghost, [child], []),
        await store.execution_stop_if_owned(ghost, InterruptKind.CANCEL),
        await store.execution_stop_if_owned(ghost, InterruptKind.PAUSE),
    ]
    for tr in refused:
        assert tr == TransitionResult(False, None, "execution does not exist")
    taken = await store.execution_take_message_if_owned(ghost, "a", 0)
    assert (taken.applied, taken.message, taken.signal_seq) == (False, None, 0)
    assert await store.execution_get(child.id) is None
    assert await store.execution_get(ghost.execution_id) is None


async def test_stop_cancel_records_cancelled(store: Store, clock: ManualClock) -> None:
    ex = await submit_unique(store, cancellable=True)
    claim = await claim_exactly(store, ex.id)
    assert (await store.execution_cancel(ex.id, actor="op")).changed
    at = clock.advance(1)
    tr = await store.execution_stop_if_owned(claim, InterruptKind.CANCEL)
    assert tr.applied and tr.execution is not None
    got = await get(store, ex.id)
    assert tr.execution == got
    assert got.status == Status.CANCELLED and got.lease_owner is None
    assert got.updated_at == at and got.result is None
    events = await assert_history_intact(store, ex.id)
    assert kinds(events) == ["pending", "running", "cancel_requested", "cancelled"]
    # the owner's later completion is refused and kept
    late = await store.execution_complete_if_owned(claim, "too late")
    assert late.applied is False
    assert (await get(store, ex.id)).status == Status.CANCELLED


async def test_stop_cancel_waits_for_children_that_cannot_be_cancelled(
    store: Store, clock: ManualClock
) -> None:
    root = await submit_unique(store, cancellable=True)
    claim = await claim_exactly(store, root.id)
    stubborn = new_child(root.id)  # not -cancellable
    soft = new_child(root.id, cancellable=True)
    assert (await store.execution_spawn_if_owned(claim, [stubborn, soft], [])).applied
    result = await store.execution_cancel(root.id, actor="op")
    assert result.changed and result.execution is not None
    assert result.execution.status == Status.RUNNING
    assert (await get(store, soft.id)).status == Status.CANCELLED
    assert (await get(store, stubborn.id)).cancel_requested_at is None

    tr = await store.execution_stop_if_owned(claim, InterruptKind.CANCEL)
    assert tr.execution is not None and tr.execution.status == Status.BLOCKED
    ex = await get(store, root.id)
    assert ex.status == Status.BLOCKED and ex.lease_owner is None and ex.wake_at is None
    assert ex.cancel_requested_at is not None
    events = await assert_history_intact(store, root.id)
    assert events[-1].kind == "blocked"

    at = clock.advance(3)
    await finish(store, stubborn.id)
    ex = await get(store, root.id)
    assert ex.status == Status.CANCELLED and ex.updated_at == at
    events = await assert_history_intact(store, root.id)
    assert events[-1].kind == "cancelled"
    assert events[-1].data["child_id"] == str(stubborn.id)


@pytest.mark.parametrize("kind", ["cancel", "pause"])
@pytest.mark.parametrize("how", LOSSES)
async def test_stop_without_the_lease_is_refused_and_kept(
    store: Store, clock: ManualClock, kind: str, how: str
) -> None:
    claim = await running(store, cancellable=True)
    stale, reason = await lose_lease(store, clock, claim, how)
    before = await get(store, claim.execution_id)
    tr = await store.execution_stop_if_owned(stale, InterruptKind(kind))
    late = await assert_refused_and_kept(store, before, tr, claim=stale, report=kind,
                                         reason=reason)
    assert late.data["payload"] == {"interrupt": kind}


async def test_stop_with_an_unknown_interrupt_is_rejected(store: Store) -> None:
    claim = await running(store)
    with pytest.raises(ValueError):
        await store.execution_stop_if_owned(claim, cast(Any, "explode"))
    assert (await get(store, claim.execution_id)).status == Status.RUNNING


@pytest.mark.parametrize("op", ["block", "spawn", "stop_cancel", "stop_pause"])
async def test_a_refused_engine_write_answers_the_current_row(
    store: Store, clock: ManualClock, op: str
) -> None:
    """As for complete/fail/release (test_leases): a refusal answers the execution as it is
    now, late report included."""
    claim = await running(store, cancellable=True)
    stale, _ = await lose_lease(store, clock, claim, "wrong_epoch")
    if op == "block":
        tr = await store.execution_block_if_owned(stale, wake_at=None, seen_signal=0,
                                                  events=[], reason="r")
    elif op == "spawn":
        tr = await store.execution_spawn_if_owned(stale, [new_child(claim.execution_id)], [])
    else:
        tr = await store.execution_stop_if_owned(stale, InterruptKind(op.removeprefix("stop_")))
    assert tr.applied is False
    assert tr.execution == await get(store, claim.execution_id)


# -- interrupts ------------------------------------------------------------------------------


async def test_interrupts_list_the_owners_running_executions_asked_to_stop(
    store: Store,
) -> None:
    to_cancel = await running(store, "worker-a", cancellable=True)
    to_pause = await running(store, "worker-a")
    both = await running(store, "worker-a", cancellable=True)
    await running(store, "worker-a")  # nothing asked
    withdrawn = await running(store, "worker-a")
    others = await running(store, "worker-b", cancellable=True)
    assert await store.execution_interrupts("worker-a") == []

    assert (await store.execution_cancel(to_cancel.execution_id)).changed
    assert (await store.execution_pause(to_pause.execution_id)).changed
    assert (await store.execution_pause(both.execution_id)).changed
    assert (await store.execution_cancel(both.execution_id)).changed
    assert (await store.execution_pause(withdrawn.execution_id)).changed
    assert (await store.execution_unpause(withdrawn.execution_id)).changed
    assert (await store.execution_cancel(others.execution_id)).changed
    # a blocked execution is nobody's to stop
    idle = await running(store, "worker-a")
    await block(store, idle)
    assert (await store.execution_pause(idle.execution_id)).changed

    found = await store.execution_interrupts("worker-a")
    assert sorted(found, key=lambda i: str(i.claim.execution_id)) == sorted(
        [_interrupt(to_cancel, "cancel"), _interrupt(to_pause, "pause"),
         _interrupt(both, "cancel")], key=lambda i: str(i.claim.execution_id))
    assert await store.execution_interrupts("worker-b") == [_interrupt(others, "cancel")]
    assert await store.execution_interrupts("worker-nobody") == []

    # acted on: no longer listed
    assert (await store.execution_stop_if_owned(to_pause, InterruptKind.PAUSE)).applied
    assert (await store.execution_stop_if_owned(to_cancel, InterruptKind.CANCEL)).applied
    assert await store.execution_interrupts("worker-a") == [_interrupt(both, "cancel")]


def _interrupt(claim: Claim, kind: str) -> Interrupt:
    return Interrupt(claim, InterruptKind(kind))


# -- store operations race each other --------------------------------------------------------


async def test_concurrent_blocks_of_one_claim_apply_once(
    store: Store, open_extra_store: StoreFactory
) -> None:
    other = await open_extra_store()
    claim = await running(store)

    def attempt(s: Store) -> Awaitable[TransitionResult]:
        return s.execution_block_if_owned(claim, wake_at=None, seen_signal=0, events=[],
                                          reason="r")

    results = await asyncio.gather(*(attempt(s) for s in (store, other, store, other)))
    assert sum(r.applied for r in results) == 1
    events = await assert_history_intact(store, claim.execution_id)
    assert kinds(events).count("blocked") == 1 and kinds(events).count("late_report") == 3


async def test_concurrent_sends_each_stored_once(
    store: Store, open_extra_store: StoreFactory
) -> None:
    other = await open_extra_store()
    claim = await running(store)
    await block(store, claim)
    results = await asyncio.gather(*(s.message_send(claim.execution_id, "t", i)
                                     for i, s in enumerate([store, other] * 5)))
    assert all(r.changed for r in results)
    ex = await get(store, claim.execution_id)
    assert ex.status == Status.PENDING and ex.signal_seq == 10
    events = await assert_history_intact(store, ex.id)
    assert kinds(events).count("message_arrived") == 10
    assert kinds(events).count("pending") == 2  # submitted, then woken once
