"""Store conformance: the claim and the fenced writes a worker makes (complete, fail,
release) -- docs/states.md, guarantees 2, 3 and 4. Runs unchanged against every backend."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from tests.store._support import assert_history_consistent, new_execution
from veracity.clock import ManualClock
from veracity.core.states import Status
from veracity.models import Claim, Execution, TransitionResult
from veracity.store import Store

TTL = timedelta(seconds=30)
FFQN = "app.orders.create"


async def submit(store: Store, ffqn: str = FFQN, **kw: Any) -> Execution:
    return (await store.execution_submit(new_execution(ffqn, **kw))).execution


async def claim_one(store: Store, owner: str = "worker-a", ffqn: str = FFQN) -> Claim:
    claimed = await store.execution_claim(owner, [ffqn], limit=1, lease_ttl=TTL)
    assert len(claimed) == 1
    return Claim(claimed[0].id, owner, claimed[0].lease_epoch)


async def submit_and_claim(store: Store, owner: str = "worker-a") -> Claim:
    ex = await submit(store)
    c = await claim_one(store, owner)
    assert c.execution_id == ex.id
    return c


# -- claim ------------------------------------------------------------------------------


async def test_claim_sets_running_owner_epoch_and_exact_lease(
    store: Store, clock: ManualClock
) -> None:
    ex = await submit(store)
    at = clock.advance(7)
    claimed = await store.execution_claim("worker-a", [FFQN], limit=10, lease_ttl=TTL)
    assert len(claimed) == 1
    (c,) = claimed
    assert c.id == ex.id
    assert c.status == Status.RUNNING
    assert c.lease_owner == "worker-a"
    assert c.lease_epoch == ex.lease_epoch + 1
    assert c.lease_expires_at == at + TTL
    assert c.updated_at == at
    assert c.attempt == 1
    # unchanged by the claim
    assert (c.ffqn, c.params, c.created_at, c.scheduled_at, c.deployment_id) == (
        ex.ffqn,
        ex.params,
        ex.created_at,
        ex.scheduled_at,
        ex.deployment_id,
    )
    assert await store.execution_get(ex.id) == c


async def test_claim_writes_running_event(store: Store, clock: ManualClock) -> None:
    ex = await submit(store)
    at = clock.advance(3)
    c = await claim_one(store, "worker-a")
    events = await assert_history_consistent(store, ex.id)
    assert [e.kind for e in events] == ["pending", "running"]
    running = events[1]
    assert running.seq == 2
    assert running.at == at
    # the deployment that runs it (docs/deployments.md)
    assert running.data == {"owner": "worker-a", "epoch": c.epoch, "attempt": 1,
                            "deployment_id": ex.deployment_id}


async def test_claim_takes_only_due_executions(store: Store, clock: ManualClock) -> None:
    due = await submit(store)
    later = await submit(store, scheduled_at=clock.now() + timedelta(seconds=60))

    first = await store.execution_claim("w", [FFQN], limit=10, lease_ttl=TTL)
    assert [e.id for e in first] == [due.id]

    clock.advance(timedelta(seconds=60) - timedelta(microseconds=1))
    assert await store.execution_claim("w", [FFQN], limit=10, lease_ttl=TTL) == []
    got = await store.execution_get(later.id)
    assert got is not None and got.status == Status.PENDING

    clock.advance(timedelta(microseconds=1))  # now == scheduled_at: due
    second = await store.execution_claim("w", [FFQN], limit=10, lease_ttl=TTL)
    assert [e.id for e in second] == [later.id]


async def test_claim_takes_only_the_named_workflows(store: Store) -> None:
    a = await submit(store, "app.a")
    b = await submit(store, "app.b")
    c = await submit(store, "app.c")
    await submit(store, "app.a.sub")  # a prefix is not a match
    claimed = await store.execution_claim("w", ["app.a", "app.b"], limit=10, lease_ttl=TTL)
    assert {e.id for e in claimed} == {a.id, b.id}
    assert await store.execution_claim("w", ["app.zzz"], limit=10, lease_ttl=TTL) == []
    got = await store.execution_get(c.id)
    assert got is not None and got.status == Status.PENDING


async def test_claim_respects_limit_oldest_scheduled_first(
    store: Store, clock: ManualClock
) -> None:
    base = clock.now()
    # submitted in an order different from their schedule
    made = [await submit(store, scheduled_at=base - timedelta(seconds=s)) for s in (3, 5, 1, 4, 2)]
    by_schedule = sorted(made, key=lambda e: e.scheduled_at)
    first = await store.execution_claim("w", [FFQN], limit=2, lease_ttl=TTL)
    assert [e.id for e in first] == [e.id for e in by_schedule[:2]]
    second = await store.execution_claim("w", [FFQN], limit=2, lease_ttl=TTL)
    assert [e.id for e in second] == [e.id for e in by_schedule[2:4]]
    third = await store.execution_claim("w", [FFQN], limit=2, lease_ttl=TTL)
    assert [e.id for e in third] == [by_schedule[4].id]
    assert await store.execution_claim("w", [FFQN], limit=2, lease_ttl=TTL) == []


async def test_claim_with_no_workflows_or_zero_limit_claims_nothing(store: Store) -> None:
    ex = await submit(store)
    assert await store.execution_claim("w", [], limit=10, lease_ttl=TTL) == []
    assert await store.execution_claim("w", [FFQN], limit=0, lease_ttl=TTL) == []
    got = await store.execution_get(ex.id)
    assert got is not None
    assert got.status == Status.PENDING and got.lease_epoch == 0
    assert len(await store.history_list(ex.id)) == 1


async def test_claim_never_takes_running_or_terminal_executions(store: Store) -> None:
    running = await submit_and_claim(store, "worker-a")
    done = await submit_and_claim(store, "worker-a")
    assert (await store.execution_complete_if_owned(done, {"r": 1})).applied
    failed = await submit_and_claim(store, "worker-a")
    assert (await store.execution_fail_if_owned(failed, {"e": 1})).applied
    assert await store.execution_claim("worker-b", [FFQN], limit=10, lease_ttl=TTL) == []
    got = await store.execution_get(running.execution_id)
    assert got is not None
    assert got.lease_owner == "worker-a" and got.lease_epoch == running.epoch


async def test_lease_epoch_increments_on_each_claim(store: Store, clock: ManualClock) -> None:
    ex = await submit(store)
    epochs = []
    for i in range(4):
        c = await claim_one(store, f"worker-{i}")
        epochs.append(c.epoch)
        clock.advance(1)
        assert (await store.execution_release_if_owned(c, "again")).applied
    assert epochs == [1, 2, 3, 4]
    got = await store.execution_get(ex.id)
    assert got is not None and got.lease_epoch == 4
    await assert_history_consistent(store, ex.id)


async def test_the_first_claim_is_the_start_and_later_claims_keep_it(
    store: Store, clock: ManualClock
) -> None:
    ex = await submit(store)
    assert ex.started_at is None
    first = clock.advance(3)
    c = await claim_one(store, "worker-a")
    got = await store.execution_get(ex.id)
    assert got is not None and got.started_at == first == got.updated_at
    clock.advance(5)
    assert (await store.execution_release_if_owned(c, "again")).applied
    again = await store.execution_claim("worker-b", [FFQN], limit=1, lease_ttl=TTL)
    assert [e.started_at for e in again] == [first]
    assert again[0].updated_at == first + timedelta(seconds=5)


async def test_status_counts_are_the_unfinished_executions_by_status(store: Store) -> None:
    assert await store.execution_status_counts() == {}
    for _ in range(3):
        await submit(store)
    await submit(store, ffqn="app.other.run")
    c = await claim_one(store, "worker-a")
    assert await store.execution_status_counts() == {"pending": 3, "running": 1}
    assert (await store.execution_complete_if_owned(c, None)).applied
    # a terminal execution is no longer counted: terminal ends are counted as they happen
    assert await store.execution_status_counts() == {"pending": 3}


# -- fenced writes: applied -------------------------------------------------------------


@pytest.mark.parametrize(
    "result",
    [
        {"total": 12.5, "items": [{"sku": "ä-1", "qty": 2}], "note": "日本"},
        [1, [2, [3, []]]],
        "done",
        0,
        False,
        "",
        [],
        {},
    ],
    ids=[
        "object",
        "array",
        "string",
        "zero",
        "false",
        "empty-string",
        "empty-array",
        "empty-object",
    ],
)
async def test_complete_if_owned_records_result(
    store: Store, clock: ManualClock, result: Any
) -> None:
    c = await submit_and_claim(store)
    at = clock.advance(5)
    tr = await store.execution_complete_if_owned(c, result)
    assert tr.applied is True
    assert tr.execution is not None
    ex = tr.execution
    assert ex.status == Status.COMPLETED
    assert ex.result == result
    assert type(ex.result) is type(result)
    assert ex.error is None
    assert ex.lease_owner is None
    assert ex.lease_expires_at is None
    assert ex.lease_epoch == c.epoch
    assert ex.updated_at == at
    assert await store.execution_get(c.execution_id) == ex
    events = await assert_history_consistent(store, c.execution_id)
    assert events[-1].kind == "completed"
    assert events[-1].data == {"owner": "worker-a", "epoch": c.epoch}


async def test_complete_with_json_null_result_completes(store: Store) -> None:
    c = await submit_and_claim(store)
    tr = await store.execution_complete_if_owned(c, None)
    assert tr.applied is True
    assert tr.execution is not None
    assert tr.execution.status == Status.COMPLETED
    assert tr.execution.result is None
    got = await store.execution_get(c.execution_id)
    assert got is not None and got.status == Status.COMPLETED and got.result is None
    await assert_history_consistent(store, c.execution_id)


@pytest.mark.parametrize(
    ("transient", "status"),
    [(False, Status.FAILED), (True, Status.FAILED_TRANSIENT)],
    ids=["failed", "failed_transient"],
)
async def test_fail_if_owned_records_error(
    store: Store, clock: ManualClock, transient: bool, status: Status
) -> None:
    c = await submit_and_claim(store)
    at = clock.advance(5)
    error = {"type": "ValueError", "message": "bad input: ñ", "trace": ["a", "b"]}
    tr = await store.execution_fail_if_owned(c, error, transient=transient)
    assert tr.applied is True
    assert tr.execution is not None
    ex = tr.execution
    assert ex.status == status
    assert ex.status.is_terminal
    assert ex.error == error
    assert ex.result is None
    assert ex.lease_owner is None
    assert ex.lease_expires_at is None
    assert ex.updated_at == at
    assert await store.execution_get(c.execution_id) == ex
    events = await assert_history_consistent(store, c.execution_id)
    assert events[-1].kind == str(status)
    assert events[-1].data == {"owner": "worker-a", "epoch": c.epoch, "error": error}


async def test_release_if_owned_returns_to_pending_and_is_claimable_again(
    store: Store, clock: ManualClock
) -> None:
    c = await submit_and_claim(store, "worker-a")
    at = clock.advance(5)
    tr = await store.execution_release_if_owned(c, "worker shutting down")
    assert tr.applied is True
    assert tr.execution is not None
    ex = tr.execution
    assert ex.status == Status.PENDING
    assert ex.lease_owner is None
    assert ex.lease_expires_at is None
    assert ex.lease_epoch == c.epoch
    assert ex.updated_at == at
    assert ex.result is None and ex.error is None
    events = await assert_history_consistent(store, c.execution_id)
    assert events[-1].kind == "pending"
    assert events[-1].data == {
        "owner": "worker-a",
        "epoch": c.epoch,
        "reason": "worker shutting down",
    }

    again = await claim_one(store, "worker-b")
    assert again.execution_id == c.execution_id
    assert again.epoch == c.epoch + 1
    got = await store.execution_get(c.execution_id)
    assert got is not None
    assert got.status == Status.RUNNING and got.lease_owner == "worker-b"
    await assert_history_consistent(store, c.execution_id)


async def test_lease_is_valid_until_just_before_it_expires(
    store: Store, clock: ManualClock
) -> None:
    c = await submit_and_claim(store)
    clock.advance(TTL - timedelta(microseconds=1))
    tr = await store.execution_complete_if_owned(c, "in time")
    assert tr.applied is True
    assert tr.execution is not None and tr.execution.result == "in time"


# -- fenced writes: refused ---------------------------------------------------------------

Report = Callable[[Store, Claim], Awaitable[TransitionResult]]

RESULT = {"answer": 42, "text": "ünïcode"}
ERROR = {"type": "Boom", "message": "it broke"}
STEP = {"step": "charge-card", "position": 3, "result": {"charged": 12.5}}


async def _complete_as_batch(s: Store, c: Claim) -> TransitionResult:
    (only,) = await s.execution_complete_many_if_owned(c.owner, [(c, RESULT)])
    return only


# name -> (the call, its report kind, the payload a late report keeps)
REPORTS: dict[str, tuple[Report, str, dict[str, Any]]] = {
    "complete": (
        lambda s, c: s.execution_complete_if_owned(c, RESULT),
        "complete",
        {"result": RESULT},
    ),
    "fail": (
        lambda s, c: s.execution_fail_if_owned(c, ERROR),
        "fail",
        {"error": ERROR, "transient": False},
    ),
    "fail_transient": (
        lambda s, c: s.execution_fail_if_owned(c, ERROR, transient=True),
        "fail",
        {"error": ERROR, "transient": True},
    ),
    "release": (
        lambda s, c: s.execution_release_if_owned(c, "giving up"),
        "release",
        {"reason": "giving up"},
    ),
    "complete_many": (_complete_as_batch, "complete", {"result": RESULT}),
    "checkpoint": (
        lambda s, c: s.execution_checkpoint_if_owned(c, "step_completed", STEP),
        "step_completed",
        STEP,
    ),
}


async def _wrong_owner(store: Store, clock: ManualClock) -> tuple[Claim, Claim | None, str]:
    c = await submit_and_claim(store, "worker-a")
    return Claim(c.execution_id, "worker-b", c.epoch), c, "owner"


async def _stale_epoch(store: Store, clock: ManualClock) -> tuple[Claim, Claim | None, str]:
    old = await submit_and_claim(store, "worker-a")
    assert (await store.execution_release_if_owned(old, "retry")).applied
    new = await claim_one(store, "worker-a")  # same owner, newer epoch
    assert new.epoch == old.epoch + 1
    return old, new, "epoch"


async def _lease_expired(store: Store, clock: ManualClock) -> tuple[Claim, Claim | None, str]:
    c = await submit_and_claim(store, "worker-a")
    clock.advance(TTL)  # expires_at > now no longer holds
    return c, None, "expired"


async def _never_claimed(store: Store, clock: ManualClock) -> tuple[Claim, Claim | None, str]:
    ex = await submit(store)
    return Claim(ex.id, "worker-a", ex.lease_epoch), None, "pending"


async def _released(store: Store, clock: ManualClock) -> tuple[Claim, Claim | None, str]:
    c = await submit_and_claim(store, "worker-a")
    assert (await store.execution_release_if_owned(c, "bye")).applied
    return c, None, "pending"


async def _already_completed(store: Store, clock: ManualClock) -> tuple[Claim, Claim | None, str]:
    c = await submit_and_claim(store, "worker-a")
    assert (await store.execution_complete_if_owned(c, {"first": True})).applied
    return c, None, "completed"


async def _already_failed(store: Store, clock: ManualClock) -> tuple[Claim, Claim | None, str]:
    c = await submit_and_claim(store, "worker-a")
    assert (await store.execution_fail_if_owned(c, {"first": True})).applied
    return c, None, "failed"


# name -> setup returning (the claim to report with, the live claim if any, reason hint)
SCENARIOS = {
    "wrong_owner": _wrong_owner,
    "stale_epoch": _stale_epoch,
    "lease_expired": _lease_expired,
    "pending_never_claimed": _never_claimed,
    "pending_after_release": _released,
    "already_completed": _already_completed,
    "already_failed": _already_failed,
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("report", list(REPORTS))
async def test_fenced_write_from_wrong_state_or_lease_changes_nothing_and_is_reported(
    store: Store, clock: ManualClock, scenario: str, report: str
) -> None:
    reported_with, live, hint = await SCENARIOS[scenario](store, clock)
    call, kind, payload = REPORTS[report]
    execution_id = reported_with.execution_id
    before = await store.execution_get(execution_id)
    assert before is not None
    history_before = await store.history_list(execution_id)
    at = clock.advance(1)

    tr = await call(store, reported_with)

    assert tr.applied is False
    after = await store.execution_get(execution_id)
    assert after is not None
    assert tr.execution == after
    # nothing about the execution changed: status, result, error, lease
    unchanged = dataclasses.replace(
        after, updated_at=before.updated_at, history_seq=before.history_seq
    )
    assert unchanged == before
    assert after.history_seq == before.history_seq + 1
    # ... but the refused report is kept in history
    history = await store.history_list(execution_id)
    assert history[: len(history_before)] == history_before
    assert len(history) == len(history_before) + 1
    late = history[-1]
    assert late.kind == "late_report"
    assert late.seq == len(history_before) + 1
    assert late.at == at
    assert late.data["report"] == kind
    assert late.data["owner"] == reported_with.owner
    assert late.data["epoch"] == reported_with.epoch
    assert late.data["payload"] == payload
    reason = late.data["reason"]
    assert isinstance(reason, str) and hint in reason
    assert tr.reason == reason
    await assert_history_consistent(store, execution_id)

    if live is not None:  # the rightful owner is unaffected and can still finish
        done = await store.execution_complete_if_owned(live, "rightful")
        assert done.applied is True
        assert done.execution is not None and done.execution.result == "rightful"
        await assert_history_consistent(store, execution_id)


@pytest.mark.parametrize("report", list(REPORTS))
async def test_fenced_write_to_unknown_execution_is_refused(store: Store, report: str) -> None:
    call, _, _ = REPORTS[report]
    unknown = uuid.uuid4()
    tr = await call(store, Claim(unknown, "worker-a", 1))
    assert tr.applied is False
    assert tr.execution is None
    assert await store.execution_get(unknown) is None
    assert await store.history_list(unknown) == []


async def test_late_complete_never_overwrites_a_result(store: Store) -> None:
    c = await submit_and_claim(store)
    assert (await store.execution_complete_if_owned(c, {"v": 1})).applied
    again = await store.execution_complete_if_owned(c, {"v": 2})
    assert again.applied is False
    assert again.execution is not None
    assert again.execution.status == Status.COMPLETED
    assert again.execution.result == {"v": 1}


async def test_expired_lease_is_refused_even_if_nobody_reclaimed(
    store: Store, clock: ManualClock
) -> None:
    c = await submit_and_claim(store)
    clock.advance(TTL * 10)
    for call, _, _ in REPORTS.values():
        tr = await call(store, c)
        assert tr.applied is False
        assert tr.execution is not None
        assert tr.execution.status == Status.RUNNING  # stale running, never a false terminal
    history = await assert_history_consistent(store, c.execution_id)
    assert [e.kind for e in history] == ["pending", "running", *["late_report"] * len(REPORTS)]
