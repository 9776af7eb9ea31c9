"""Store conformance: an operator's retry of a failed execution (``execution_retry``) and a
workflow's own retry (``execution_retry_if_owned``). Runs unchanged against every backend.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta

import pytest

from tests.store._support import (
    assert_history_consistent,
    claim_exactly,
    get,
    kinds,
    new_execution,
    submit_unique,
)
from veracity.clock import ManualClock
from veracity.core.requests import InterruptKind
from veracity.core.states import Status
from veracity.models import ControlResult, Execution, NewExecution
from veracity.store import Store

REPLAYED = [("step_completed", {"pos": 0, "name": "a", "result": 1}),
            ("now_recorded", {"pos": 1, "at": "2030-01-01T00:00:00+00:00"})]


async def failed(store: Store, *, transient: bool = False) -> Execution:
    e = await submit_unique(store)
    claim = await claim_exactly(store, e.id)
    assert (await store.execution_fail_if_owned(claim, {"code": "x"},
                                                transient=transient)).applied
    return await get(store, e.id)


def retry_of(old: Execution) -> NewExecution:
    return dataclasses.replace(new_execution(old.ffqn, old.params, deployment_id="dep-2"),
                               retry_of=old.id)


@pytest.mark.parametrize("transient", [False, True], ids=["failed", "failed_transient"])
async def test_retry_creates_a_linked_execution_with_the_replayed_calls(
    store: Store, clock: ManualClock, transient: bool
) -> None:
    old = await failed(store, transient=transient)
    old_history = await store.history_list(old.id)
    at = clock.advance(5)
    new = retry_of(old)

    res = await store.execution_retry(old.id, new, REPLAYED, actor="ops")

    created = await get(store, new.id)
    assert res == ControlResult(created, changed=True)
    assert (created.status, created.retry_of, created.deployment_id, created.attempt) == (
        Status.PENDING, old.id, "dep-2", 1)
    assert (created.params, created.created_at, created.scheduled_at) == (old.params, at, at)
    events = await assert_history_consistent(store, created.id)
    assert kinds(events) == ["pending", "step_completed", "now_recorded"]
    assert events[0].data["retry_of"] == str(old.id) and events[0].data["replays"] == 2
    assert [(e.kind, e.data) for e in events[1:]] == REPLAYED
    # the failed execution is left as it was
    assert await get(store, old.id) == old
    assert await store.history_list(old.id) == old_history
    # claimable like any pending execution
    claimed = await store.execution_claim("w", [old.ffqn], limit=5,
                                          lease_ttl=timedelta(seconds=30))
    assert [c.id for c in claimed] == [created.id]


@pytest.mark.parametrize("how", ["pending", "running", "completed", "cancelled"])
async def test_retry_is_refused_unless_failed(store: Store, how: str) -> None:
    e = await submit_unique(store)
    if how != "pending":
        claim = await claim_exactly(store, e.id)
        if how == "completed":
            assert (await store.execution_complete_if_owned(claim, 1)).applied
        elif how == "cancelled":
            await store.execution_cancel(e.id, actor="t")
            assert (await store.execution_stop_if_owned(claim, InterruptKind.CANCEL)).applied
    current = await get(store, e.id)
    new = retry_of(current)
    res = await store.execution_retry(e.id, new, REPLAYED)
    assert res.execution == current and res.refused is not None
    assert res.code == "wrong_state" and str(current.status) in res.refused
    assert await store.execution_get(new.id) is None


async def test_retry_of_an_unknown_execution(store: Store) -> None:
    new = dataclasses.replace(new_execution(), retry_of=uuid.uuid4())
    assert await store.execution_retry(uuid.uuid4(), new, []) == ControlResult(None)
    assert await store.execution_get(new.id) is None


async def test_a_workflow_retry_is_pending_again_after_its_delay(
    store: Store, clock: ManualClock
) -> None:
    e = await submit_unique(store)
    claim = await claim_exactly(store, e.id)
    at = clock.advance(1)

    res = await store.execution_retry_if_owned(claim, {"code": "workflow_error"}, retry=1,
                                               of=2, delay=30)

    ex = await get(store, e.id)
    assert res.applied and res.execution == ex
    assert (ex.status, ex.lease_owner, ex.scheduled_at, ex.attempt) == (
        Status.PENDING, None, at + timedelta(seconds=30), 1)
    events = await assert_history_consistent(store, e.id)
    assert events[-1].kind == "pending"
    assert events[-1].data == {"owner": claim.owner, "epoch": claim.epoch,
                               "reason": "workflow retry", "retry": 1, "of": 2, "delay": 30,
                               "error": {"code": "workflow_error"}}
    assert await store.execution_claim("w", [e.ffqn], limit=1,
                                       lease_ttl=timedelta(seconds=30)) == []
    clock.advance(30)
    assert [c.id for c in await store.execution_claim(
        "w", [e.ffqn], limit=1, lease_ttl=timedelta(seconds=30))] == [e.id]
    # a stale claim's retry is refused and kept as a late report
    late = await store.execution_retry_if_owned(claim, {"code": "x"}, retry=2, of=2, delay=0)
    assert not late.applied
    assert (await store.history_list(e.id))[-1].kind == "late_report"


@pytest.mark.parametrize(("retry", "delay"), [(1, -0.5), (0, 0), (-1, 30)],
                         ids=["negative_delay", "retry_zero", "negative_retry"])
async def test_a_workflow_retry_with_a_bad_number_or_delay_is_refused_and_changes_nothing(
    store: Store, retry: int, delay: float
) -> None:
    """Each bad input alone is refused: a delay below 0 (even by half a second), a retry
    number below 1; the execution stays running under its lease, with no new event."""
    e = await submit_unique(store)
    claim = await claim_exactly(store, e.id)
    before = await get(store, e.id)
    with pytest.raises(ValueError, match="a delay of 0 or more and a number from 1"):
        await store.execution_retry_if_owned(claim, {"code": "x"}, retry=retry, of=2,
                                             delay=delay)
    assert await get(store, e.id) == before
    # the least accepted values: retry 1, no delay
    assert (await store.execution_retry_if_owned(claim, {"code": "x"}, retry=1, of=2,
                                                 delay=0)).applied


async def test_the_options_of_a_fenced_exit_are_named(store: Store) -> None:
    """``transient`` and the retry's numbers are keyword-only: a bare ``True`` or ``2`` in a
    call could not say which option it is. The claim and the error may be named too."""
    e = await submit_unique(store)
    claim = await claim_exactly(store, e.id)
    with pytest.raises(TypeError):
        await store.execution_fail_if_owned(claim, {"code": "x"}, True)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        await store.execution_retry_if_owned(claim, {"code": "x"}, 1, 2, 0)  # type: ignore[call-arg]
    assert (await get(store, e.id)).status is Status.RUNNING
    assert (await store.execution_retry_if_owned(claim=claim, error={"code": "x"}, retry=1,
                                                 of=2, delay=0)).applied
    claim = await claim_exactly(store, e.id)
    assert (await store.execution_fail_if_owned(claim=claim, error={"code": "x"},
                                                transient=True)).applied
