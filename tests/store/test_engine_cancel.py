"""Store conformance: what operators ask of executions -- cancel (recursive, -cancellable
only, idempotent; docs/workflows.md) and pause/unpause -- and how a cancel
that races the execution's own end is kept as a late report (docs/states.md, guarantees 1, 4 and 7).
Runs unchanged against every backend.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
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
from veracity.models import Claim, Execution, NewExecution
from veracity.store import Store

TTL = ENGINE_TTL

# -- helpers -------------------------------------------------------------------------------


async def _running(store: Store, **kw: Any) -> Claim:
    ex = await submit_unique(store, **kw)
    return await claim_exactly(store, ex.id)


async def block(store: Store, claim: Claim, *, wake_at: datetime | None = None) -> Execution:
    seen = (await get(store, claim.execution_id)).signal_seq
    tr = await store.execution_block_if_owned(
        claim, wake_at=wake_at, seen_signal=seen, events=[], reason="wait")
    assert tr.applied and tr.execution is not None and tr.execution.status == Status.BLOCKED
    return tr.execution


async def waiting_parent(
    store: Store, execution_id: uuid.UUID, children: list[NewExecution],
    *, wake_at: datetime | None = None,
) -> Claim:
    """Claim ``execution_id``, spawn ``children`` and block waiting for them."""
    claim = await claim_exactly(store, execution_id, owner=f"worker-{execution_id.hex[:6]}")
    assert (await store.execution_spawn_if_owned(claim, children, [])).applied
    await block(store, claim, wake_at=wake_at)
    return claim


async def in_state(store: Store, clock: ManualClock, state: str) -> Execution:
    """A cancellable execution in a non-terminal state other than running."""
    if state == "pending":
        return await submit_unique(store, cancellable=True)
    if state == "pending_later":
        return await submit_unique(store, cancellable=True,
                                   scheduled_at=clock.now() + timedelta(hours=1))
    if state == "paused_submitted":
        return await submit_unique(store, cancellable=True, paused=True)
    ex = await submit_unique(store, cancellable=True)
    claim = await claim_exactly(store, ex.id)
    if state == "blocked_timer":
        return await block(store, claim, wake_at=clock.now() + timedelta(hours=1))
    if state == "blocked":
        return await block(store, claim)
    assert state == "paused_from_blocked"
    await block(store, claim, wake_at=clock.now() + timedelta(hours=1))
    paused = await store.execution_pause(ex.id)
    assert paused.execution is not None
    return paused.execution


async def ended(store: Store, how: str) -> Execution:
    """A cancellable execution in a terminal state."""
    ex = await submit_unique(store, cancellable=True)
    if how == "cancelled":
        assert (await store.execution_cancel(ex.id)).changed
        return await get(store, ex.id)
    claim = await claim_exactly(store, ex.id)
    if how == "completed":
        tr = await store.execution_complete_if_owned(claim, {"r": 1})
    elif how == "failed":
        tr = await store.execution_fail_if_owned(claim, {"e": 1})
    else:
        tr = await store.execution_fail_if_owned(claim, {"e": 1}, transient=True)
    assert tr.applied
    return await get(store, ex.id)


async def complete(store: Store, execution_id: uuid.UUID, owner: str = "worker-c") -> None:
    claim = await claim_exactly(store, execution_id, owner)
    assert (await store.execution_complete_if_owned(claim, "done")).applied


NON_RUNNING = ["pending", "pending_later", "blocked", "blocked_timer", "paused_submitted",
               "paused_from_blocked"]
TERMINAL = ["completed", "failed", "failed_transient", "cancelled"]


# -- cancel one execution ----------------------------------------------------------------------


@pytest.mark.parametrize("state", NON_RUNNING)
async def test_cancel_records_a_waiting_execution_cancelled_at_once(
    store: Store, clock: ManualClock, state: str
) -> None:
    ex = await in_state(store, clock, state)
    before = await get(store, ex.id)
    at = clock.advance(2)
    result = await store.execution_cancel(ex.id, actor="alice")
    assert result.changed is True and result.refused is None
    got = await get(store, ex.id)
    assert result.execution == got
    assert got.status == Status.CANCELLED
    assert got.cancel_requested_at == at and got.updated_at == at
    assert got.wake_at is None and got.paused_from is None and got.lease_owner is None
    assert got.result is None and got.error is None
    events = await assert_history_intact(store, ex.id, first=str(
        Status.PAUSED if state == "paused_submitted" else Status.PENDING))
    assert events[-2].seq == before.history_seq + 1
    assert [(e.kind, e.data) for e in events[-2:]] == [
        ("cancel_requested", {"by": "alice", "root": str(ex.id)}),
        ("cancelled", {"by": "alice", "reason": "cancelled on request"}),
    ]
    assert all(e.at == at for e in events[-2:])
    # gone for good: never claimed, not woken, not unpaused
    clock.advance(timedelta(days=1))
    assert await store.execution_claim("w", [ex.ffqn], limit=1, lease_ttl=TTL) == []
    assert await store.execution_wake_due() == []
    assert (await store.execution_unpause(ex.id)).refused is not None
    assert (await get(store, ex.id)).status == Status.CANCELLED


async def test_cancel_of_a_running_execution_only_requests_it(
    store: Store, clock: ManualClock
) -> None:
    ex = await submit_unique(store, cancellable=True)
    claim = await claim_exactly(store, ex.id)
    before = await get(store, ex.id)
    at = clock.advance(1)
    result = await store.execution_cancel(ex.id, actor="bob")
    assert result.changed is True
    got = await get(store, ex.id)
    assert result.execution == got
    assert got == dataclasses.replace(before, cancel_requested_at=at,
                                      history_seq=before.history_seq + 1)
    events = await assert_history_intact(store, ex.id)
    assert events[-1].kind == "cancel_requested"
    assert events[-1].data == {"by": "bob", "root": str(ex.id)}
    # its owner learns of it and still holds the lease
    interrupts = await store.execution_interrupts(claim.owner)
    assert [(i.claim, i.kind) for i in interrupts] == [(claim, "cancel")]
    assert (await store.execution_checkpoint_if_owned(claim, "step_completed", {})).applied


@pytest.mark.parametrize("end", TERMINAL)
async def test_cancel_of_a_terminal_execution_changes_nothing(store: Store, end: str) -> None:
    ex = await ended(store, end)
    result = await store.execution_cancel(ex.id, actor="op")
    assert result.changed is False and result.refused is None
    assert result.execution == ex
    assert await get(store, ex.id) == ex


@pytest.mark.parametrize("state", ["pending", "blocked", "running"])
async def test_cancel_twice_changes_nothing_the_second_time(
    store: Store, clock: ManualClock, state: str
) -> None:
    if state == "running":
        ex = await submit_unique(store, cancellable=True)
        await claim_exactly(store, ex.id)
    else:
        ex = await in_state(store, clock, state)
    assert (await store.execution_cancel(ex.id)).changed
    first = await get(store, ex.id)
    clock.advance(1)
    again = await store.execution_cancel(ex.id, actor="again")
    assert again.changed is False and again.refused is None
    assert again.execution == first
    assert await get(store, ex.id) == first
    await assert_history_intact(store, ex.id)


async def test_cancel_of_an_unknown_execution(store: Store) -> None:
    result = await store.execution_cancel(uuid.uuid4())
    assert result.execution is None and result.changed is False


# -- cancel a tree -----------------------------------------------------------------------------


async def test_cancel_leaves_a_non_cancellable_child_and_its_subtree_alone(
    store: Store, clock: ManualClock
) -> None:
    """root (-cancellable) -> mid (not) -> leaf (-cancellable); root -> direct (-cancellable)."""
    root = await submit_unique(store, cancellable=True)
    mid = new_child(root.id)
    direct = new_child(root.id, cancellable=True)
    await waiting_parent(store, root.id, [mid, direct])
    leaf = new_child(mid.id, cancellable=True)
    await waiting_parent(store, mid.id, [leaf])
    mid_before = await get(store, mid.id)
    leaf_before = await get(store, leaf.id)
    root_before = await get(store, root.id)

    at = clock.advance(1)
    result = await store.execution_cancel(root.id, actor="op")
    assert result.changed is True
    assert result.execution is not None and result.execution.status == Status.BLOCKED

    d = await get(store, direct.id)
    assert d.status == Status.CANCELLED and d.cancel_requested_at == at
    d_events = await assert_history_intact(store, direct.id)
    assert [(e.kind, e.data) for e in d_events[-2:]] == [
        ("cancel_requested", {"by": "op", "root": str(root.id)}),
        ("cancelled", {"by": "op", "reason": "cancelled with its parent"}),
    ]
    # left alone: not even asked
    assert await get(store, mid.id) == mid_before
    assert await get(store, leaf.id) == leaf_before
    # the root waits for mid: still blocked (not woken by direct's end), cancel requested
    r = await get(store, root.id)
    assert r.status == Status.BLOCKED and r.cancel_requested_at == at
    assert r.signal_seq == root_before.signal_seq + 1
    assert kinds(await assert_history_intact(store, root.id))[-1] == "cancel_requested"
    assert (await store.execution_cancel(root.id)).changed is False

    # the subtree finishes on its own; the root is cancelled when mid ends
    clock.advance(1)
    await complete(store, leaf.id)
    m = await get(store, mid.id)
    assert m.status == Status.PENDING  # woken by its child, as usual
    assert (await get(store, root.id)).status == Status.BLOCKED
    mid_claim = await claim_exactly(store, mid.id, "worker-m")
    assert (await get(store, root.id)).status == Status.BLOCKED
    done_at = clock.advance(1)
    assert (await store.execution_complete_if_owned(mid_claim, "mid done")).applied
    r = await get(store, root.id)
    assert r.status == Status.CANCELLED and r.updated_at == done_at
    events = await assert_history_intact(store, root.id)
    assert events[-1].kind == "cancelled" and events[-1].data["child_id"] == str(mid.id)
    for x in (mid.id, leaf.id, direct.id):
        await assert_history_intact(store, x)
    assert (await get(store, mid.id)).status == Status.COMPLETED
    assert (await get(store, leaf.id)).status == Status.COMPLETED


async def test_cancel_closes_a_cancellable_tree_bottom_up_in_one_call(
    store: Store, clock: ManualClock
) -> None:
    """root -> a -> b (pending), root -> timer (blocked on a sleep), root -> held (paused);
    all -cancellable."""
    root = await submit_unique(store, cancellable=True)
    a = new_child(root.id, cancellable=True)
    sleeper = new_child(root.id, cancellable=True)
    held = new_child(root.id, cancellable=True)
    await waiting_parent(store, root.id, [a, sleeper, held])
    b = new_child(a.id, cancellable=True)
    await waiting_parent(store, a.id, [b])
    c = await claim_exactly(store, sleeper.id)
    await block(store, c, wake_at=clock.now() + timedelta(hours=1))
    assert (await store.execution_pause(held.id)).changed

    at = clock.advance(1)
    result = await store.execution_cancel(root.id, actor="op")
    assert result.changed is True
    assert result.execution is not None and result.execution.status == Status.CANCELLED
    for x in (root.id, a.id, b.id, sleeper.id, held.id):
        got = await get(store, x)
        assert got.status == Status.CANCELLED, x
        assert got.cancel_requested_at == at and got.updated_at == at
        assert got.wake_at is None and got.paused_from is None
        events = await assert_history_intact(store, x)
        assert kinds(events)[-2:] == ["cancel_requested", "cancelled"]
    # bottom-up: a parent is recorded cancelled by the end of its last child
    a_events = await store.history_list(a.id)
    assert a_events[-1].data["child_id"] == str(b.id)
    root_events = await store.history_list(root.id)
    assert root_events[-1].data["child_id"] in {str(a.id), str(sleeper.id), str(held.id)}
    # nothing of the tree is left to run or wake
    clock.advance(timedelta(days=1))
    assert await store.execution_wake_due() == []
    assert (await store.execution_cancel(root.id)).changed is False


@pytest.mark.parametrize("leaf_end", ["stop", "complete", "fail"])
async def test_a_running_leaf_keeps_running_and_its_parents_wait_for_it(
    store: Store, clock: ManualClock, leaf_end: str
) -> None:
    root = await submit_unique(store, cancellable=True)
    mid = new_child(root.id, cancellable=True)
    await waiting_parent(store, root.id, [mid])
    leaf = new_child(mid.id, cancellable=True)
    await waiting_parent(store, mid.id, [leaf])
    leaf_claim = await claim_exactly(store, leaf.id, "worker-leaf")

    requested = clock.advance(1)
    result = await store.execution_cancel(root.id, actor="op")
    assert result.changed is True
    for x, status in ((root.id, Status.BLOCKED), (mid.id, Status.BLOCKED),
                      (leaf.id, Status.RUNNING)):
        got = await get(store, x)
        assert got.status == status and got.cancel_requested_at == requested
        assert kinds(await assert_history_intact(store, x))[-1] == "cancel_requested"
    assert [i.kind for i in await store.execution_interrupts("worker-leaf")] == ["cancel"]
    # nothing happens until the leaf ends, however often one asks
    assert (await store.execution_cancel(root.id)).changed is False
    assert (await get(store, root.id)).status == Status.BLOCKED

    ended_at = clock.advance(1)
    if leaf_end == "stop":
        assert (await store.execution_stop_if_owned(leaf_claim, InterruptKind.CANCEL)).applied
        leaf_status = Status.CANCELLED
    elif leaf_end == "complete":
        assert (await store.execution_complete_if_owned(leaf_claim, "won")).applied
        leaf_status = Status.COMPLETED
    else:
        assert (await store.execution_fail_if_owned(leaf_claim, {"e": 1})).applied
        leaf_status = Status.FAILED
    assert (await get(store, leaf.id)).status == leaf_status
    for x in (mid.id, root.id):
        got = await get(store, x)
        assert got.status == Status.CANCELLED and got.updated_at == ended_at
    assert (await store.history_list(mid.id))[-1].data["child_id"] == str(leaf.id)
    assert (await store.history_list(root.id))[-1].data["child_id"] == str(mid.id)
    leaf_events = await assert_history_intact(store, leaf.id)
    if leaf_status != Status.CANCELLED:  # the cancellation lost: kept as a late report
        assert kinds(leaf_events)[-2:] == [str(leaf_status), "late_report"]
        assert leaf_events[-1].data["report"] == "cancel"
    for x in (mid.id, root.id):
        await assert_history_intact(store, x)


async def test_cancel_of_a_paused_parent_waits_for_its_children(
    store: Store, clock: ManualClock
) -> None:
    root = await submit_unique(store, cancellable=True)
    stubborn = new_child(root.id)
    await waiting_parent(store, root.id, [stubborn])
    assert (await store.execution_pause(root.id)).changed
    result = await store.execution_cancel(root.id, actor="op")
    assert result.changed is True
    r = await get(store, root.id)
    assert r.status == Status.PAUSED and r.cancel_requested_at is not None
    at = clock.advance(1)
    await complete(store, stubborn.id)
    r = await get(store, root.id)
    assert r.status == Status.CANCELLED and r.updated_at == at and r.paused_from is None
    events = await assert_history_intact(store, root.id)
    assert events[-1].kind == "cancelled"
    assert events[-1].data["child_id"] == str(stubborn.id)


async def test_cancel_stops_the_timer_of_a_parent_that_waits_for_children(
    store: Store, clock: ManualClock
) -> None:
    """Cancelling closes the join sets: timers are cancelled (docs/workflows.md). A parent left
    waiting for a child that cannot be cancelled must not be woken by its old timer (it
    would be claimed and run on, though cancelled)."""
    root = await submit_unique(store, cancellable=True)
    stubborn = new_child(root.id)
    await waiting_parent(store, root.id, [stubborn], wake_at=clock.now() + timedelta(minutes=5))
    assert (await store.execution_cancel(root.id, actor="op")).changed
    clock.advance(timedelta(minutes=10))
    woken = await store.execution_wake_due()
    r = await get(store, root.id)
    assert ([e.id for e in woken], r.status) == ([], Status.BLOCKED)
    assert await store.execution_claim("w", [root.ffqn], limit=1, lease_ttl=TTL) == []
    # it is recorded cancelled when the child ends, its timer gone with it
    await complete(store, stubborn.id)
    r = await get(store, root.id)
    assert (r.status, r.wake_at) == (Status.CANCELLED, None)
    await assert_history_intact(store, root.id)


async def test_a_message_does_not_wake_a_parent_whose_cancel_waits_for_children(
    store: Store,
) -> None:
    """Like the trigger (a child's end does not wake a parent whose cancellation is
    pending), a message must not make it pending: it would be claimed and run on."""
    root = await submit_unique(store, cancellable=True)
    stubborn = new_child(root.id)
    await waiting_parent(store, root.id, [stubborn])
    assert (await store.execution_cancel(root.id, actor="op")).changed
    result = await store.message_send(root.id, "go", 1)
    assert result.refused is None
    r = await get(store, root.id)
    assert r.status == Status.BLOCKED, r.status
    await assert_history_intact(store, root.id)


# -- cancel racing the execution's own end ---------------------------------------------------


# (a lease that expires after the request ends cancelled instead: see
# test_recovery_of_a_cancel_requested_execution_records_it_cancelled)
@pytest.mark.parametrize("end", ["complete", "fail", "fail_transient"])
async def test_an_end_after_a_cancel_request_wins_and_the_cancel_is_kept(
    store: Store, clock: ManualClock, end: str
) -> None:
    ex = await submit_unique(store, cancellable=True)
    claim = await claim_exactly(store, ex.id)
    assert (await store.execution_cancel(ex.id, actor="op")).changed
    requested = await get(store, ex.id)
    at = clock.advance(1)
    if end == "complete":
        assert (await store.execution_complete_if_owned(claim, {"total": 3})).applied
        status = Status.COMPLETED
    elif end == "fail":
        assert (await store.execution_fail_if_owned(claim, {"code": "x"})).applied
        status = Status.FAILED
    else:
        assert (await store.execution_fail_if_owned(claim, {"code": "x"}, transient=True)).applied
        status = Status.FAILED_TRANSIENT
    got = await get(store, ex.id)
    assert got.status == status and got.updated_at == at
    if end == "complete":
        assert got.result == {"total": 3}
    events = await assert_history_intact(store, ex.id)
    assert kinds(events)[-3:] == ["cancel_requested", str(status), "late_report"]
    late = events[-1]
    assert late.at == at
    assert late.data["report"] == "cancel"
    assert str(status) in late.data["reason"]
    assert late.data["requested_at"] is not None
    # and the cancel stays answered "nothing to change"
    again = await store.execution_cancel(ex.id)
    assert again.changed is False and again.execution == got
    assert requested.cancel_requested_at == got.cancel_requested_at


async def test_a_lost_cancel_names_when_it_was_requested(
    store: Store, clock: ManualClock
) -> None:
    """The late report says when the cancellation was asked for, as a time (ISO 8601), the
    same on every backend."""
    ex = await submit_unique(store, cancellable=True)
    claim = await claim_exactly(store, ex.id)
    asked = clock.advance(1)
    assert (await store.execution_cancel(ex.id)).changed
    clock.advance(1)
    assert (await store.execution_complete_if_owned(claim, 1)).applied
    late = (await store.history_list(ex.id))[-1]
    assert late.kind == "late_report"
    requested_at = late.data["requested_at"]
    assert isinstance(requested_at, str), requested_at
    assert datetime.fromisoformat(requested_at) == asked


@pytest.mark.parametrize("how", ["stopped", "cancelled_while_blocked"])
async def test_the_owner_ending_a_cancelled_execution_is_refused_and_kept(
    store: Store, clock: ManualClock, how: str
) -> None:
    ex = await submit_unique(store, cancellable=True)
    claim = await claim_exactly(store, ex.id)
    if how == "stopped":
        assert (await store.execution_cancel(ex.id)).changed
        assert (await store.execution_stop_if_owned(claim, InterruptKind.CANCEL)).applied
    else:
        await block(store, claim)
        assert (await store.execution_cancel(ex.id)).changed
    before = await get(store, ex.id)
    assert before.status == Status.CANCELLED
    clock.advance(1)
    tr = await store.execution_complete_if_owned(claim, {"late": True})
    assert tr.applied is False
    after = await get(store, ex.id)
    assert after == dataclasses.replace(before, history_seq=before.history_seq + 1)
    events = await assert_history_intact(store, ex.id)
    assert events[-1].kind == "late_report"
    assert events[-1].data["report"] == "complete"
    assert events[-1].data["reason"] == "execution is cancelled"
    assert events[-1].data["payload"] == {"result": {"late": True}}


# PostgreSQL only: SQLite has a single writer, so no lock order can deadlock there
@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_concurrent_cancel_and_completion_of_a_child_both_answer(
    store: Store, raw: RawSQL, open_extra_store: StoreFactory
) -> None:
    """The cancel locks the parent, then its children; a child's completion locks the child,
    then (its trigger) the parent. Interleaved, PostgreSQL sees a deadlock and aborts one of
    them: both calls must still answer (applied or refused), never raise (docs/states.md:
    "zero rows updated means someone else won, never an exception trace").

    Deterministic: the completion's connection checks for deadlocks after 50 ms, the
    cancel's after 30 s, so the completion is always the one PostgreSQL aborts."""
    assert store.backend == "postgresql"
    patient = await open_extra_store(_pg_options(raw.url, "-c deadlock_timeout=30s"))
    quick = await open_extra_store(_pg_options(raw.url, "-c deadlock_timeout=50ms"))
    root = await submit_unique(store, cancellable=True)
    kid = new_child(root.id, cancellable=True)
    await waiting_parent(store, root.id, [kid])
    kid_claim = await claim_exactly(store, kid.id, "worker-kid")

    def waiting() -> int:
        return int(raw.scalar(
            "SELECT count(DISTINCT l.pid) FROM pg_locks AS l "
            "JOIN pg_stat_activity AS a USING (pid) "
            "WHERE NOT l.granted AND a.datname = current_database()"))

    async def until_waiting(n: int) -> None:
        deadline = time.monotonic() + 10
        while waiting() < n:
            assert time.monotonic() < deadline, "nobody waits for the lock"
            await asyncio.sleep(0.005)

    with psycopg.connect(raw.url) as holder:
        holder.execute("SELECT 1 FROM veracity_executions WHERE id = %s FOR UPDATE", (root.id,))
        cancel = asyncio.create_task(patient.execution_cancel(root.id, actor="op"))
        await until_waiting(1)  # the cancel waits for the root
        completion = asyncio.create_task(quick.execution_complete_if_owned(kid_claim, "won"))
        await until_waiting(2)  # the child is locked by its completion, which waits too
        holder.rollback()
        outcomes = await asyncio.gather(cancel, completion, return_exceptions=True)
    errors = [(name, o) for name, o in zip(("cancel", "completion"), outcomes, strict=True)
              if isinstance(o, BaseException)]
    assert errors == [], errors
    k = await get(store, kid.id)
    r = await get(store, root.id)
    assert k.status in (Status.COMPLETED, Status.CANCELLED)
    assert r.status == Status.CANCELLED
    await assert_history_intact(store, kid.id)
    await assert_history_intact(store, root.id)


def _pg_options(url: str, options: str) -> str:
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query, keep_blank_values=True), ("options", options)]
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


# -- a cancel request must not be stranded -----------------------------------------------------


async def test_blocking_after_a_cancel_request_does_not_strand_the_cancel(
    store: Store, clock: ManualClock
) -> None:
    """The worker blocks (waits for a message, no timer) before it has seen the cancel
    request: the execution must not stay blocked for ever with the cancel unanswered."""
    ex = await submit_unique(store, cancellable=True)
    claim = await claim_exactly(store, ex.id)
    assert (await store.execution_cancel(ex.id, actor="op")).changed
    tr = await store.execution_block_if_owned(
        claim, wake_at=None, seen_signal=0, events=[("recv_started", {"pos": 0})],
        reason="recv")
    assert tr.applied
    got = await get(store, ex.id)
    assert got.status in (Status.CANCELLED, Status.PENDING), (
        f"cancel requested, then blocked with nothing to wake it: {got.status}")
    await assert_history_intact(store, ex.id)


async def test_a_child_spawned_after_the_cancel_request_is_cancelled_too(
    store: Store, clock: ManualClock
) -> None:
    """The worker spawns a -cancellable child before it has seen the cancel request, then
    stops: the child must be cancelled with it, not run to the end while the parent waits."""
    root = await submit_unique(store, cancellable=True)
    claim = await claim_exactly(store, root.id)
    assert (await store.execution_cancel(root.id, actor="op")).changed
    kid = new_child(root.id, cancellable=True)
    assert (await store.execution_spawn_if_owned(claim, [kid], [("child_submitted", {})])).applied
    assert (await store.execution_stop_if_owned(claim, InterruptKind.CANCEL)).applied
    k = await get(store, kid.id)
    r = await get(store, root.id)
    assert (k.status, r.status) == (Status.CANCELLED, Status.CANCELLED)
    await assert_history_intact(store, kid.id)
    await assert_history_intact(store, root.id)


async def test_a_stopped_cancel_says_why_it_ended_or_what_it_waits_for(store: Store) -> None:
    """Guards the reason the stop operation (store/_ops.py _stop_cancel) records: with no
    child left it says the run stopped at its next await; with a child that may not be
    cancelled it says the execution waits for it (and it is blocked, not cancelled), so an
    operator reading the history is not told the opposite of what happened."""
    alone = await submit_unique(store, cancellable=True)
    alone_claim = await claim_exactly(store, alone.id)
    assert (await store.execution_cancel(alone.id, actor="op")).changed
    assert (await store.execution_stop_if_owned(alone_claim, InterruptKind.CANCEL)).applied
    ended = (await assert_history_intact(store, alone.id))[-1]
    assert ended.kind == "cancelled"
    assert ended.data["reason"] == "cancel requested; stopped at its next await"

    root = await submit_unique(store, cancellable=True)
    claim = await claim_exactly(store, root.id)
    kid = new_child(root.id, cancellable=False)
    assert (await store.execution_spawn_if_owned(claim, [kid], [("child_submitted", {})])).applied
    assert (await store.execution_cancel(root.id, actor="op")).changed
    assert (await store.execution_stop_if_owned(claim, InterruptKind.CANCEL)).applied
    assert (await get(store, root.id)).status == Status.BLOCKED
    waiting = (await assert_history_intact(store, root.id))[-1]
    assert waiting.kind == "blocked"
    assert waiting.data["reason"] == (
        "cancel requested; waiting for 1 children that cannot be cancelled")


async def test_recovery_of_a_cancel_requested_execution_records_it_cancelled(
    store: Store, clock: ManualClock
) -> None:
    """Its worker died before acting on the cancel. Recovery would make it pending, and a
    pending execution whose cancel was requested is cancelled at once (docs/workflows.md), not run
    again."""
    ex = await submit_unique(store, cancellable=True)
    await claim_exactly(store, ex.id)
    assert (await store.execution_cancel(ex.id, actor="op")).changed
    clock.advance(TTL)
    await store.execution_recover_expired(max_attempts=5)
    got = await get(store, ex.id)
    assert got.status == Status.CANCELLED, got.status
    await assert_history_intact(store, ex.id)


async def test_blocking_after_a_pause_request_parks_it(store: Store, clock: ManualClock) -> None:
    """A blocking wait is a step boundary: an execution asked to pause that blocks is
    paused (from blocked), so that unpause withdraws it as an operator expects."""
    claim = await _running(store)
    assert (await store.execution_pause(claim.execution_id, actor="op")).changed
    wake_at = clock.now() + timedelta(hours=1)
    assert (await store.execution_block_if_owned(
        claim, wake_at=wake_at, seen_signal=0, events=[], reason="sleep")).applied
    got = await get(store, claim.execution_id)
    assert (got.status, got.paused_from) == (Status.PAUSED, "blocked"), (
        f"pause requested, then blocked: {got.status}, pause_requested_at="
        f"{got.pause_requested_at}; unpause answers "
        f"{(await store.execution_unpause(claim.execution_id)).refused!r}")
    unpaused = await store.execution_unpause(claim.execution_id)
    assert unpaused.execution is not None and unpaused.execution.status == Status.BLOCKED
    assert unpaused.execution.wake_at == wake_at


# -- pause and unpause ---------------------------------------------------------------------------


async def test_pause_and_unpause_a_pending_execution(store: Store, clock: ManualClock) -> None:
    ex = await submit_unique(store)
    at = clock.advance(1)
    result = await store.execution_pause(ex.id, actor="op")
    assert result.changed is True and result.refused is None
    got = await get(store, ex.id)
    assert result.execution == got
    assert got.status == Status.PAUSED and got.paused_from == "pending"
    assert got.updated_at == at
    events = await assert_history_intact(store, ex.id)
    assert events[-1].kind == "paused"
    assert events[-1].data == {"by": "op", "from": "pending"}
    assert await store.execution_claim("w", [ex.ffqn], limit=1, lease_ttl=TTL) == []

    at = clock.advance(1)
    back = await store.execution_unpause(ex.id, actor="op2")
    assert back.changed is True and back.refused is None
    got = await get(store, ex.id)
    assert back.execution == got
    assert got.status == Status.PENDING and got.paused_from is None and got.updated_at == at
    events = await assert_history_intact(store, ex.id)
    assert events[-1].kind == "pending"
    assert events[-1].data == {"by": "op2", "reason": "unpaused"}
    await claim_exactly(store, ex.id)


async def test_pause_and_unpause_a_blocked_execution_still_waiting(
    store: Store, clock: ManualClock
) -> None:
    claim = await _running(store)
    wake_at = clock.now() + timedelta(hours=1)
    await block(store, claim, wake_at=wake_at)
    result = await store.execution_pause(claim.execution_id)
    assert result.changed
    got = await get(store, claim.execution_id)
    assert got.status == Status.PAUSED and got.paused_from == "blocked"
    assert got.wake_at == wake_at
    clock.advance(timedelta(minutes=59))
    back = await store.execution_unpause(claim.execution_id)
    assert back.execution is not None
    assert back.execution.status == Status.BLOCKED and back.execution.wake_at == wake_at
    assert back.execution.paused_from is None
    events = await assert_history_intact(store, claim.execution_id)
    assert kinds(events)[-3:] == ["blocked", "paused", "blocked"]
    assert events[-1].data["reason"] == "unpaused"
    # still sleeping: woken by its timer, as if never paused
    assert await store.execution_wake_due() == []
    clock.advance(timedelta(minutes=1))
    assert [e.id for e in await store.execution_wake_due()] == [claim.execution_id]


@pytest.mark.parametrize("meanwhile", ["timer_due", "message", "child_ended"])
async def test_unpause_of_a_blocked_execution_whose_wait_ended_makes_it_pending(
    store: Store, clock: ManualClock, meanwhile: str
) -> None:
    claim = await _running(store)
    kid = new_child(claim.execution_id)
    assert (await store.execution_spawn_if_owned(claim, [kid], [])).applied
    await block(store, claim, wake_at=clock.now() + timedelta(hours=1))
    assert (await store.execution_pause(claim.execution_id)).changed
    if meanwhile == "timer_due":
        clock.advance(timedelta(hours=1))
        assert await store.execution_wake_due() == []  # paused: the sweep leaves it
    elif meanwhile == "message":
        assert (await store.message_send(claim.execution_id, "t", 1)).changed
    else:
        await complete(store, kid.id)
    assert (await get(store, claim.execution_id)).status == Status.PAUSED
    back = await store.execution_unpause(claim.execution_id)
    assert back.changed and back.execution is not None
    assert back.execution.status == Status.PENDING and back.execution.wake_at is None
    events = await assert_history_intact(store, claim.execution_id)
    assert events[-1].kind == "pending"
    await claim_exactly(store, claim.execution_id, "worker-b")


async def test_pause_of_a_running_execution_is_a_request_unpause_withdraws(
    store: Store, clock: ManualClock
) -> None:
    claim = await _running(store)
    before = await get(store, claim.execution_id)
    at = clock.advance(1)
    result = await store.execution_pause(claim.execution_id, actor="op")
    assert result.changed is True
    got = await get(store, claim.execution_id)
    assert result.execution == got
    assert got == dataclasses.replace(before, pause_requested_at=at,
                                      history_seq=before.history_seq + 1)
    events = await assert_history_intact(store, claim.execution_id)
    assert events[-1].kind == "pause_requested" and events[-1].data == {"by": "op"}
    assert [i.kind for i in await store.execution_interrupts(claim.owner)] == ["pause"]

    again = await store.execution_pause(claim.execution_id)
    assert again.changed is False and again.refused is None and again.execution == got

    back = await store.execution_unpause(claim.execution_id, actor="op")
    assert back.changed is True and back.refused is None
    withdrawn = await get(store, claim.execution_id)
    assert withdrawn == dataclasses.replace(before, history_seq=before.history_seq + 2)
    events = await assert_history_intact(store, claim.execution_id)
    assert events[-1].kind == "pause_withdrawn"
    assert await store.execution_interrupts(claim.owner) == []
    # nothing left to withdraw
    refused = await store.execution_unpause(claim.execution_id)
    assert refused.refused is not None and refused.changed is False


@pytest.mark.parametrize("state", ["pending", "blocked"])
async def test_pause_twice_changes_nothing_the_second_time(
    store: Store, clock: ManualClock, state: str
) -> None:
    ex = await in_state(store, clock, state)
    assert (await store.execution_pause(ex.id)).changed
    first = await get(store, ex.id)
    again = await store.execution_pause(ex.id)
    assert again.changed is False and again.refused is None and again.execution == first
    assert await get(store, ex.id) == first


@pytest.mark.parametrize("end", TERMINAL)
async def test_pause_and_unpause_of_a_terminal_execution_are_refused(
    store: Store, end: str
) -> None:
    ex = await ended(store, end)
    for result in (await store.execution_pause(ex.id), await store.execution_unpause(ex.id)):
        assert result.refused is not None and end in result.refused
        assert result.changed is False and result.execution == ex
    assert await get(store, ex.id) == ex


@pytest.mark.parametrize("state", ["pending", "blocked", "running"])
async def test_unpause_of_an_execution_not_paused_is_refused(
    store: Store, clock: ManualClock, state: str
) -> None:
    if state == "running":
        ex = await get(store, (await _running(store)).execution_id)
    else:
        ex = await in_state(store, clock, state)
    result = await store.execution_unpause(ex.id)
    assert result.refused is not None and state in result.refused
    assert result.changed is False and result.execution == ex
    assert await get(store, ex.id) == ex


async def test_pause_and_unpause_of_an_unknown_execution(store: Store) -> None:
    for result in (await store.execution_pause(uuid.uuid4()),
                   await store.execution_unpause(uuid.uuid4())):
        assert result.execution is None and result.changed is False


async def test_submitted_paused_is_not_claimable_until_unpaused(
    store: Store, clock: ManualClock
) -> None:
    ex = await submit_unique(store, paused=True)
    assert ex.status == Status.PAUSED and ex.paused_from == "pending"
    events = await assert_history_intact(store, ex.id, first="paused")
    assert len(events) == 1
    assert await store.execution_claim("w", [ex.ffqn], limit=1, lease_ttl=TTL) == []
    clock.advance(timedelta(days=1))
    assert await store.execution_claim("w", [ex.ffqn], limit=1, lease_ttl=TTL) == []
    back = await store.execution_unpause(ex.id)
    assert back.changed and back.execution is not None
    assert back.execution.status == Status.PENDING
    await claim_exactly(store, ex.id)
    await assert_history_intact(store, ex.id, first="paused")


async def test_stop_pause_then_unpause_resumes_a_paused_running_execution(
    store: Store,
) -> None:
    claim = await _running(store)
    assert (await store.execution_pause(claim.execution_id)).changed
    assert (await store.execution_stop_if_owned(claim, InterruptKind.PAUSE)).applied
    again = await store.execution_pause(claim.execution_id)
    assert again.changed is False
    assert (await store.execution_unpause(claim.execution_id)).changed
    again_claim = await claim_exactly(store, claim.execution_id, "worker-b")
    assert again_claim.epoch == claim.epoch + 1
    await assert_history_intact(store, claim.execution_id)
