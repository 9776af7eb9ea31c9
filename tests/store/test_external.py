"""Store conformance: executions delegated to an external engine (docs/external.md) -- the worker's
delegation before it sends the trigger, the engine's id, the engine's callbacks, the
reconciler's reads and writes of one tick, an operator's resolution -- and the worker's
batched journal (``execution_checkpoint_many_if_owned``). Runs unchanged against every
backend.

A refused write changes nothing: neither the row nor its history, unless the rule keeps
the refused report as a ``late_report`` (and then only that event and ``history_seq``
move). Every state change appends its event (docs/states.md, guarantee 7).
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from datetime import datetime
from typing import Any, cast

import pytest

from tests.store._support import (
    DB_ERRORS,
    ENGINE_TTL,
    RawSQL,
    assert_history_consistent,
    claim_exactly,
    get,
    kinds,
    new_execution,
    submit_unique,
    unique_ffqn,
)
from veracity.clock import ManualClock
from veracity.core.reconcile import FlagKind, WriteKind
from veracity.core.requests import CallbackOutcome, CallbackReport, ResolveAction
from veracity.core.states import Status
from veracity.models import (
    CallbackResult,
    Claim,
    ControlResult,
    Execution,
    ExecutionFilter,
    HistoryEvent,
    ReconcileAction,
    TransitionResult,
)
from veracity.store import Store
from veracity.store._common import REPEATED_IN_BATCH
from veracity.store._ops import token_hash

TTL = ENGINE_TTL
COMPLETE, FAIL = CallbackReport.COMPLETE, CallbackReport.FAIL
ENGINE = "n8n"
TOKEN = "callback-token-of-the-run"
OWNER = "worker-a"
STALE = "lease is held by another owner or epoch"

# -- helpers -------------------------------------------------------------------------------


def flag_action(eid: uuid.UUID, external_id: str | None, reason: str,
                data: dict[str, Any] | None = None, kind: FlagKind | None = None
                ) -> ReconcileAction:
    """A flag decided by a look; by default the kind a look would give it."""
    if kind is None:
        kind = FlagKind.NO_EXTERNAL_ID if external_id is None else FlagKind.UNKNOWN_ID
    return ReconcileAction(eid, external_id, WriteKind.FLAG, reason, data or {}, flag=kind)


def end_action(eid: uuid.UUID, external_id: str | None, reason: str,
               data: dict[str, Any] | None = None, to: Status = Status.FAILED_TRANSIENT
               ) -> ReconcileAction:
    """An end decided by a look (the engine confirmed the run finished)."""
    return ReconcileAction(eid, external_id, WriteKind.TERMINATE, reason, data or {}, to=to)


async def operator_ends(store: Store, eid: uuid.UUID, action: str = "cancel",
                        reason: str = "r", actor: str = "ops") -> ControlResult:
    """An operator ends a delegated run without the engine's confirmation (forced)."""
    current = await get(store, eid)
    return await store.execution_resolve(
        eid, action=ResolveAction(action), external_id=None, reason=reason, actor=actor,
        expected_external_id=current.external_execution_id, unconfirmed="forced in a test")


async def running(store: Store, owner: str = OWNER, execution_id: uuid.UUID | None = None
                  ) -> Claim:
    """A running execution held by ``owner`` (a plain worker's run: no engine)."""
    if execution_id is None:
        ex = await submit_unique(store)
    else:
        new = dataclasses.replace(new_execution(unique_ffqn()), id=execution_id)
        ex = (await store.execution_submit(new)).execution
    return await claim_exactly(store, ex.id, owner)


async def delegate(store: Store, claim: Claim, *, token: str = TOKEN) -> Execution:
    tr = await store.execution_delegate_if_owned(claim, ENGINE, token_hash(token))
    assert tr.applied and tr.execution is not None
    return tr.execution


async def delegated(store: Store, *, token: str = TOKEN,
                    execution_id: uuid.UUID | None = None) -> uuid.UUID:
    """Running, delegated to the engine, no external id yet (the trigger is on its way)."""
    claim = await running(store, execution_id=execution_id)
    await delegate(store, claim, token=token)
    return claim.execution_id


async def attached(store: Store, external_id: str = "run-1", *, token: str = TOKEN,
                   execution_id: uuid.UUID | None = None) -> uuid.UUID:
    """Running, delegated, with the engine's id: the engine runs it."""
    eid = await delegated(store, token=token, execution_id=execution_id)
    res = await store.execution_record_external_id(eid, external_id)
    assert res.changed and res.refused is None
    return eid


async def completed(store: Store) -> uuid.UUID:
    """Finished by a plain worker."""
    claim = await running(store)
    assert (await store.execution_complete_if_owned(claim, {"ok": True})).applied
    return claim.execution_id


async def snapshot(store: Store, execution_id: uuid.UUID) -> tuple[Execution, list[HistoryEvent]]:
    return await get(store, execution_id), await store.history_list(execution_id)


async def assert_unchanged(
    store: Store, execution_id: uuid.UUID, before: tuple[Execution, list[HistoryEvent]]
) -> None:
    assert await snapshot(store, execution_id) == before
    await assert_history_consistent(store, execution_id)


async def assert_kept_as_late_report(
    store: Store, before: tuple[Execution, list[HistoryEvent]]
) -> HistoryEvent:
    """Nothing changed but one late_report appended; returns it."""
    row, history = before
    after, events = await snapshot(store, row.id)
    assert after == dataclasses.replace(row, history_seq=row.history_seq + 1)
    assert events[:-1] == history
    late = events[-1]
    assert (late.kind, late.seq) == ("late_report", row.history_seq + 1)
    await assert_history_consistent(store, row.id)
    return late


# -- execution_delegate_if_owned -------------------------------------------------------------


async def test_delegate_hands_the_running_execution_to_the_engine(
    store: Store, clock: ManualClock
) -> None:
    claim = await running(store)
    before = await get(store, claim.execution_id)
    at = clock.advance(2)  # the trigger is recorded when it is sent, not at the claim

    tr = await store.execution_delegate_if_owned(claim, ENGINE, token_hash(TOKEN))

    after = await get(store, claim.execution_id)
    assert tr == TransitionResult(True, after)
    # (updated_at: see test_delegation_and_the_engines_id_leave_updated_at_alone)
    assert after == dataclasses.replace(
        before, engine=ENGINE, callback_token_hash=token_hash(TOKEN), triggered_at=at,
        lease_owner=None, lease_expires_at=None, updated_at=after.updated_at,
        history_seq=before.history_seq + 1,
    )
    assert after.status == Status.RUNNING
    assert after.external_execution_id is None
    assert after.lease_epoch == claim.epoch
    events = await store.history_list(claim.execution_id)
    assert [(e.seq, e.kind) for e in events] == [
        (1, "pending"), (2, "running"), (3, "trigger_sending")]
    assert events[-1].at == at
    data = dict(events[-1].data)
    triggered_at = data.pop("triggered_at")
    assert data == {"engine": ENGINE, "owner": OWNER, "epoch": claim.epoch}
    assert datetime.fromisoformat(triggered_at) == at


async def test_a_delegated_execution_holds_no_lease(store: Store, clock: ManualClock) -> None:
    """From the delegation on, the worker's claim is no longer a lease: its writes are
    refused (late reports), its heartbeat renews nothing, and lease recovery never takes
    the execution back (the engine runs it)."""
    claim = await running(store)
    await delegate(store, claim)
    before = await snapshot(store, claim.execution_id)

    tr = await store.execution_complete_if_owned(claim, "from the worker")
    assert (tr.applied, tr.reason) == (False, STALE)
    late = await assert_kept_as_late_report(store, before)
    assert late.data["report"] == "complete"

    assert await store.lease_renew(OWNER, [claim], TTL) == []
    clock.advance(TTL * 10)
    assert await store.execution_recover_expired(max_attempts=1) == []
    ex = await get(store, claim.execution_id)
    assert (ex.status, ex.engine, ex.lease_owner) == (Status.RUNNING, ENGINE, None)


async def test_delegation_and_the_engines_id_leave_updated_at_alone(
    store: Store, clock: ManualClock
) -> None:
    claim = await running(store)
    claimed_at = (await get(store, claim.execution_id)).updated_at
    clock.advance(1)
    await delegate(store, claim)
    clock.advance(1)
    assert (await store.execution_record_external_id(claim.execution_id, "run-1")).changed
    assert (await get(store, claim.execution_id)).updated_at == claimed_at
    await assert_history_consistent(store, claim.execution_id)


DELEGATE_REFUSALS = ["expired", "wrong_epoch", "wrong_owner", "released", "ended", "twice"]


@pytest.mark.parametrize("how", DELEGATE_REFUSALS)
async def test_delegate_refused_for_a_claim_that_lost_its_lease(
    store: Store, clock: ManualClock, how: str
) -> None:
    claim = await running(store)
    stale = claim
    if how == "expired":
        clock.advance(TTL)  # lease_expires_at == now: expired
        reason = "lease expired"
    elif how == "wrong_epoch":
        assert (await store.execution_release_if_owned(claim, "again")).applied
        current = await claim_exactly(store, claim.execution_id, OWNER)
        assert current.epoch == claim.epoch + 1
        reason = STALE
    elif how == "wrong_owner":
        stale = dataclasses.replace(claim, owner="worker-z")
        reason = STALE
    elif how == "released":
        assert (await store.execution_release_if_owned(claim, "gave it back")).applied
        reason = "execution is pending"
    elif how == "ended":
        assert (await store.execution_complete_if_owned(claim, 1)).applied
        reason = "execution is completed"
    else:
        assert how == "twice"
        await delegate(store, claim)
        reason = STALE
    before = await snapshot(store, claim.execution_id)
    clock.advance(1)

    tr = await store.execution_delegate_if_owned(stale, "other-engine", token_hash("other"))

    assert (tr.applied, tr.reason) == (False, reason)
    assert tr.execution == await get(store, claim.execution_id)
    late = await assert_kept_as_late_report(store, before)
    assert late.data == {"report": "trigger", "owner": stale.owner, "epoch": stale.epoch,
                         "payload": {"engine": "other-engine"}, "reason": reason}
    assert late.at == clock.now()
    ex = await get(store, claim.execution_id)
    assert ex.engine == (ENGINE if how == "twice" else None)
    assert ex.callback_token_hash == (token_hash(TOKEN) if how == "twice" else None)


@pytest.mark.parametrize("request_", ["cancel", "pause"])
async def test_delegate_carries_out_a_cancel_or_pause_requested_since_the_claim(
    store: Store, clock: ManualClock, request_: str
) -> None:
    """A worker claimed it, then a cancel or pause was requested: at the delegation the
    request is carried out instead, and the answer says it is not delegated (no trigger
    may be sent)."""
    claim = await running(store)
    eid = claim.execution_id
    if request_ == "cancel":
        assert (await store.execution_cancel(eid, actor="ops")).changed
    else:
        assert (await store.execution_pause(eid, actor="ops")).changed
    at = clock.advance(1)

    tr = await store.execution_delegate_if_owned(claim, ENGINE, token_hash(TOKEN))

    ex = await get(store, eid)
    expected = Status.CANCELLED if request_ == "cancel" else Status.PAUSED
    assert tr == TransitionResult(True, ex)
    assert (ex.status, ex.engine, ex.triggered_at, ex.lease_owner, ex.updated_at) == (
        expected, None, None, None, at)
    events = await assert_history_consistent(store, eid)
    assert events[-1].kind == str(expected)
    assert "trigger_sending" not in kinds(events)


async def test_pause_of_a_running_delegated_execution_is_refused(
    store: Store, clock: ManualClock
) -> None:
    """The engine cannot pause a run: refused as not_pausable, with or without its id."""
    for eid in (await delegated(store), await attached(store, "run-p")):
        before = await snapshot(store, eid)
        clock.advance(1)
        res = await store.execution_pause(eid, actor="ops")
        assert res.code == "not_pausable" and res.execution == before[0]
        assert res.refused is not None and "cannot pause a run" in res.refused
        await assert_unchanged(store, eid, before)


async def test_a_callback_records_the_operator_request_it_overtook(
    store: Store, clock: ManualClock
) -> None:
    eid = await attached(store, "run-1")
    requested = await store.execution_resolve(
        eid, action=ResolveAction.CANCEL, external_id=None, reason="withdrawn", actor="ops",
        expected_external_id="run-1")
    assert requested.changed and requested.execution is not None
    asked_at = requested.execution.end_requested_at
    assert asked_at is not None
    clock.advance(1)

    res = await store.execution_callback(eid, TOKEN, COMPLETE, {"ok": True})

    assert res.outcome == "applied" and res.execution is not None
    ex = await get(store, eid)
    assert (ex.status, ex.end_request, ex.end_requested_at) == (Status.COMPLETED, None, None)
    events = await assert_history_consistent(store, eid)
    assert events[-1].data["overtook"] == [{
        "request": "resolve cancel", "by": "ops", "requested_at": asked_at.isoformat(),
        "outcome": "the engine reported first; its outcome stands"}]


async def test_flag_counts_by_kind_include_terminal_forced_ones(store: Store) -> None:
    assert await store.execution_flag_counts() == {}
    a, b, c = [await attached(store, f"run-{i}") for i in "abc"]
    d = await delegated(store)
    assert await store.execution_reconcile_apply([
        flag_action(a, "run-a", "x"), flag_action(b, "run-b", "y"),
        flag_action(c, "run-c", "z", kind=FlagKind.STOP_UNCONFIRMED),
        flag_action(d, None, "w")])
    assert (await operator_ends(store, b)).changed
    assert await store.execution_flag_counts() == {
        "unknown_id": 1, "forced": 1, "stop_unconfirmed": 1, "no_external_id": 1}


async def test_delegate_of_an_unknown_execution(store: Store) -> None:
    unknown = Claim(uuid.uuid4(), OWNER, 1)
    tr = await store.execution_delegate_if_owned(unknown, ENGINE, token_hash(TOKEN))
    assert tr == TransitionResult(False, None, "execution does not exist")
    assert await store.history_list(unknown.execution_id) == []


# -- execution_record_external_id ------------------------------------------------------------


async def test_record_external_id_attaches_the_engines_id_once(store: Store) -> None:
    eid = await delegated(store)
    before = await get(store, eid)

    res = await store.execution_record_external_id(eid, "run-1")

    after = await get(store, eid)
    assert res == ControlResult(after, changed=True)
    assert after == dataclasses.replace(before, external_execution_id="run-1",
                                        history_seq=before.history_seq + 1)
    assert after.status == Status.RUNNING
    events = await assert_history_consistent(store, eid)
    assert kinds(events) == ["pending", "running", "trigger_sending", "external_started"]
    assert events[-1].data == {"external_execution_id": "run-1", "by": "worker"}

    # a second attach is refused and kept as a late report; the first id stays
    snap = await snapshot(store, eid)
    res = await store.execution_record_external_id(eid, "run-2")
    assert res == ControlResult(
        after, refused="execution is running and already has an external id")
    late = await assert_kept_as_late_report(store, snap)
    assert late.data == {"report": "external_id",
                         "payload": {"external_execution_id": "run-2"}, "by": "worker",
                         "reason": "execution is running with external id run-1"}
    assert (await get(store, eid)).external_execution_id == "run-1"


async def test_record_external_id_with_actor_and_reason_clears_the_flag(
    store: Store, clock: ManualClock
) -> None:
    eid = await delegated(store)
    flag = flag_action(eid, None, "no external id after the grace period")
    assert await store.execution_reconcile_apply([flag]) == [flag]
    assert (await get(store, eid)).flagged_at == clock.now()

    res = await store.execution_record_external_id(eid, "run-7", actor="ops@example",
                                                   reason="found it in the engine's UI")
    assert res.changed and res.execution is not None
    ex = await get(store, eid)
    assert res.execution == ex
    assert (ex.external_execution_id, ex.flagged_at, ex.flag_reason) == ("run-7", None, None)
    events = await assert_history_consistent(store, eid)
    assert kinds(events)[-2:] == ["flagged", "external_started"]
    assert events[-1].data == {"external_execution_id": "run-7", "by": "ops@example",
                               "reason": "found it in the engine's UI"}


async def in_state(store: Store, how: str) -> uuid.UUID:
    """An execution brought to the situation named ``how`` (the refusal tables' first
    column)."""
    if how == "plain_running":
        return (await running(store)).execution_id
    if how == "pending":
        return (await submit_unique(store)).id
    if how == "completed":
        return await completed(store)
    if how == "ended_without_id":
        eid = await delegated(store)
        assert (await store.execution_end_external(
            eid, to=Status.FAILED_TRANSIENT, expected_external_id=None)).changed
        return eid
    if how == "ended_by_callback":
        eid = await attached(store, "run-1")
        assert (await store.execution_callback(eid, TOKEN, COMPLETE, 1)).outcome == "applied"
        return eid
    if how == "ended_with_id":
        eid = await attached(store, "run-1")
    elif how == "resolved":
        eid = await delegated(store)
    else:
        raise AssertionError(f"unknown situation {how!r}")
    assert (await operator_ends(store, eid)).changed
    return eid


RECORD_REFUSALS = [
    # (how the execution got there, refused, late report's reason)
    ("plain_running", "execution is running", "execution is running"),
    ("pending", "execution is pending", "execution is pending"),
    ("completed", "execution is completed", "execution is completed"),
    ("ended_without_id", "execution is failed_transient", "execution is failed_transient"),
    ("ended_with_id", "execution is cancelled and already has an external id",
     "execution is cancelled with external id run-1"),
]


@pytest.mark.parametrize(("how", "refused", "reason"), RECORD_REFUSALS,
                         ids=[r[0] for r in RECORD_REFUSALS])
async def test_record_external_id_refused_unless_delegated_without_id(
    store: Store, how: str, refused: str, reason: str
) -> None:
    eid = await in_state(store, how)
    before = await snapshot(store, eid)

    res = await store.execution_record_external_id(eid, "run-late", actor="worker")

    assert res == ControlResult(before[0], refused=refused)
    late = await assert_kept_as_late_report(store, before)
    assert late.data == {"report": "external_id",
                         "payload": {"external_execution_id": "run-late"}, "by": "worker",
                         "reason": reason}


async def test_record_external_id_of_an_unknown_execution(store: Store) -> None:
    unknown = uuid.uuid4()
    assert await store.execution_record_external_id(unknown, "run-1") == ControlResult(None)
    assert await store.history_list(unknown) == []


# -- execution_end_external -------------------------------------------------------------------


@pytest.mark.parametrize(
    "to", [Status.FAILED_TRANSIENT, Status.CANCELLED, Status.COMPLETED, Status.FAILED])
async def test_end_external_ends_a_delegated_run(
    store: Store, clock: ManualClock, to: Status
) -> None:
    eid = await attached(store, "run-1")
    at = clock.advance(5)
    event: dict[str, Any] = {"by": "worker", "reason": f"ended as {to}"}

    res = await store.execution_end_external(
        eid, to=to, expected_external_id="run-1", result={"r": 1}, error={"code": "x"},
        event=event)

    ex = await get(store, eid)
    assert res == ControlResult(ex, changed=True)
    assert (ex.status, ex.updated_at, ex.external_execution_id) == (to, at, "run-1")
    # a result is kept only by a completion; the error as given
    assert ex.result == ({"r": 1} if to == Status.COMPLETED else None)
    assert ex.error == {"code": "x"}
    events = await assert_history_consistent(store, eid)
    assert (events[-1].kind, events[-1].data, events[-1].at) == (str(to), event, at)
    assert await store.execution_external_running() == []


async def test_end_external_without_an_id_and_without_an_event(store: Store) -> None:
    """The trigger's refusal: delegated, no external id yet (expected None); a flag it
    carried is cleared with it."""
    eid = await delegated(store)
    flag = flag_action(eid, None, "unsure")
    assert await store.execution_reconcile_apply([flag]) == [flag]

    res = await store.execution_end_external(
        eid, to=Status.FAILED, expected_external_id=None, error={"code": "engine_refused"})

    ex = await get(store, eid)
    assert res == ControlResult(ex, changed=True)
    assert (ex.status, ex.error, ex.result) == (Status.FAILED, {"code": "engine_refused"}, None)
    assert (ex.flagged_at, ex.flag_reason) == (None, None)
    events = await assert_history_consistent(store, eid)
    assert (events[-1].kind, events[-1].data) == ("failed", {})


async def test_end_external_with_any_external_id(store: Store) -> None:
    eid = await attached(store, "run-1")
    res = await store.execution_end_external(
        eid, to=Status.CANCELLED, expected_external_id="not-this-one", any_external_id=True,
        event={"by": "ops"})
    assert res.changed and res.refused is None
    assert (await get(store, eid)).status == Status.CANCELLED
    await assert_history_consistent(store, eid)


END_REFUSALS = [
    # (how the execution got there, expected_external_id, refused)
    ("other_id", "run-2", "execution is running"),
    ("expects_none_but_has_id", None, "execution is running"),
    ("expects_id_but_has_none", "run-1", "execution is running"),
    ("plain_running", None, "execution is running"),
    ("pending", None, "execution is pending"),
    ("already_ended", "run-1", "execution is cancelled"),
    ("completed_by_worker", None, "execution is completed"),
]


@pytest.mark.parametrize(("how", "expected", "refused"), END_REFUSALS,
                         ids=[r[0] for r in END_REFUSALS])
async def test_end_external_refused_and_changes_nothing(
    store: Store, clock: ManualClock, how: str, expected: str | None, refused: str
) -> None:
    if how in ("other_id", "expects_none_but_has_id"):
        eid = await attached(store, "run-1")
    elif how == "expects_id_but_has_none":
        eid = await delegated(store)
    elif how == "plain_running":
        eid = (await running(store)).execution_id
    elif how == "pending":
        eid = (await submit_unique(store)).id
    elif how == "already_ended":
        eid = await attached(store, "run-1")
        assert (await store.execution_end_external(
            eid, to=Status.CANCELLED, expected_external_id="run-1")).changed
    else:
        eid = await completed(store)
    before = await snapshot(store, eid)
    clock.advance(1)

    res = await store.execution_end_external(
        eid, to=Status.FAILED_TRANSIENT, expected_external_id=expected,
        error={"code": "late"}, event={"by": "reconciler"})

    assert res == ControlResult(before[0], refused=refused)
    await assert_unchanged(store, eid, before)


async def test_end_external_of_an_unknown_execution(store: Store) -> None:
    res = await store.execution_end_external(
        uuid.uuid4(), to=Status.FAILED_TRANSIENT, expected_external_id=None,
        any_external_id=True)
    assert res == ControlResult(None)


# -- execution_callback -----------------------------------------------------------------------


@pytest.mark.parametrize("with_id", [True, False], ids=["attached", "without_id"])
async def test_callback_complete_with_the_right_token(
    store: Store, clock: ManualClock, with_id: bool
) -> None:
    eid = await (attached(store, "run-1") if with_id else delegated(store))
    at = clock.advance(3)
    payload = {"order": 42, "items": ["ü", None]}

    res = await store.execution_callback(eid, TOKEN, COMPLETE, payload)

    ex = await get(store, eid)
    assert res == CallbackResult(CallbackOutcome.APPLIED, ex)
    assert (ex.status, ex.result, ex.error, ex.updated_at) == (
        Status.COMPLETED, payload, None, at)
    events = await assert_history_consistent(store, eid)
    assert events[-1].kind == "completed"
    assert events[-1].data == {"by": "callback", "engine": ENGINE,
                               "external_execution_id": "run-1" if with_id else None}

    # the same report again: repeat, nothing changes
    before = await snapshot(store, eid)
    clock.advance(1)
    assert await store.execution_callback(eid, TOKEN, COMPLETE, payload) == CallbackResult(
        CallbackOutcome.REPEAT, ex)
    await assert_unchanged(store, eid, before)


@pytest.mark.parametrize(("transient", "to"), [(True, Status.FAILED_TRANSIENT),
                                               (False, Status.FAILED)])
async def test_callback_fail(
    store: Store, clock: ManualClock, transient: bool, to: Status
) -> None:
    eid = await attached(store, "run-1")
    at = clock.advance(3)
    error = {"message": "node 3 threw", "node": 3}

    res = await store.execution_callback(eid, TOKEN, FAIL, error, transient=transient)

    ex = await get(store, eid)
    assert res == CallbackResult(CallbackOutcome.APPLIED, ex)
    assert (ex.status, ex.result, ex.error, ex.updated_at) == (to, None, error, at)
    events = await assert_history_consistent(store, eid)
    assert (events[-1].kind, events[-1].data) == (str(to), {
        "by": "callback", "engine": ENGINE, "external_execution_id": "run-1"})

    # the same failure again: repeat, nothing changes
    before = await snapshot(store, eid)
    again = await store.execution_callback(eid, TOKEN, FAIL, error, transient=transient)
    assert again == CallbackResult(CallbackOutcome.REPEAT, ex)
    await assert_unchanged(store, eid, before)


@pytest.mark.parametrize("token", ["wrong-token", "", TOKEN + " "],
                         ids=["wrong", "missing", "almost"])
async def test_callback_with_a_wrong_token_is_unauthorized(store: Store, token: str) -> None:
    eid = await attached(store, "run-1")
    before = await snapshot(store, eid)
    for report in ("complete", "fail"):
        res = await store.execution_callback(eid, token, CallbackReport(report), {"x": 1})
        assert res == CallbackResult(CallbackOutcome.UNAUTHORIZED, None)
    await assert_unchanged(store, eid, before)


async def test_callback_tokens_belong_to_one_execution(store: Store) -> None:
    mine = await attached(store, "run-1", token="token-one")
    other = await attached(store, "run-2", token="token-two")
    before = await snapshot(store, other)
    res = await store.execution_callback(other, "token-one", COMPLETE, 1)
    assert res == CallbackResult(CallbackOutcome.UNAUTHORIZED, None)
    await assert_unchanged(store, other, before)
    assert (await store.execution_callback(mine, "token-one", COMPLETE, 1)).outcome == "applied"


async def test_callback_on_an_execution_never_delegated_is_unauthorized(store: Store) -> None:
    """No token was ever issued: nothing authenticates, whatever is sent."""
    eid = (await running(store)).execution_id
    before = await snapshot(store, eid)
    for token in ("", TOKEN, token_hash("")):
        res = await store.execution_callback(eid, token, COMPLETE, 1)
        assert res == CallbackResult(CallbackOutcome.UNAUTHORIZED, None)
    await assert_unchanged(store, eid, before)


async def test_callback_wrong_token_on_an_ended_execution_is_unauthorized(store: Store) -> None:
    eid = await attached(store, "run-1")
    assert (await store.execution_callback(eid, TOKEN, COMPLETE, 1)).outcome == "applied"
    before = await snapshot(store, eid)
    assert await store.execution_callback(eid, "wrong", FAIL, 2) == CallbackResult(
        CallbackOutcome.UNAUTHORIZED, None)
    await assert_unchanged(store, eid, before)


async def test_callback_for_an_unknown_execution(store: Store) -> None:
    unknown = uuid.uuid4()
    assert await store.execution_callback(unknown, TOKEN, COMPLETE, 1) == CallbackResult(
        CallbackOutcome.NOT_FOUND, None)
    assert await store.history_list(unknown) == []


CONFLICTS = [
    # (how it ended, the late report, its payload, transient, reason)
    ("completed", "fail", {"message": "too late"}, False, "execution is completed"),
    ("completed", "complete", {"another": "result"}, False, "execution is completed"),
    ("failed", "fail", {"message": "another error"}, False, "execution is failed"),
    ("failed", "fail", {"message": "first"}, True, "execution is failed"),
    ("failed", "complete", {"message": "first"}, False, "execution is failed"),
    ("reconciler", "complete", {"done": True}, False, "execution is failed_transient"),
    ("resolved", "fail", {"message": "x"}, True, "execution is cancelled"),
]


@pytest.mark.parametrize(("ended", "report", "payload", "transient", "reason"), CONFLICTS,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CONFLICTS)])
async def test_callback_on_an_execution_that_ended_otherwise_is_a_conflict(
    store: Store, clock: ManualClock, ended: str, report: str, payload: Any,
    transient: bool, reason: str,
) -> None:
    eid = await attached(store, "run-1")
    if ended == "completed":
        assert (await store.execution_callback(eid, TOKEN, COMPLETE, {"r": 1})).outcome == (
            "applied")
    elif ended == "failed":
        assert (await store.execution_callback(eid, TOKEN, FAIL, {"message": "first"})
                ).outcome == "applied"
    elif ended == "reconciler":
        action = end_action(eid, "run-1", "limit breached")
        assert await store.execution_reconcile_apply([action]) == [action]
    else:
        assert (await operator_ends(store, eid)).changed
    before = await snapshot(store, eid)
    clock.advance(1)

    res = await store.execution_callback(eid, TOKEN, CallbackReport(report), payload,
                                         transient=transient)

    assert res == CallbackResult(CallbackOutcome.CONFLICT, before[0])
    late = await assert_kept_as_late_report(store, before)
    assert late.data == {"report": report, "payload": payload, "transient": transient,
                         "reason": reason}
    assert late.at == clock.now()


async def test_callback_with_an_unknown_report_is_rejected(store: Store) -> None:
    eid = await attached(store, "run-1")
    before = await snapshot(store, eid)
    with pytest.raises(ValueError, match="unknown callback"):
        await store.execution_callback(eid, TOKEN, cast(Any, "progress"), {"pct": 50})
    await assert_unchanged(store, eid, before)


# -- execution_external_running ----------------------------------------------------------------


async def test_external_running_lists_running_delegated_executions_by_id(
    store: Store,
) -> None:
    assert await store.execution_external_running() == []
    ids = sorted(uuid.uuid4() for _ in range(7))
    # created in the reverse order of their ids: the answer follows ids, not creation
    for i, eid in enumerate(reversed(ids)):
        if i % 2:
            await attached(store, f"run-{i}", execution_id=eid)
        else:
            await delegated(store, execution_id=eid)
    flagged = ids[3]
    flag = flag_action(flagged, (await get(store, flagged)).external_execution_id, "slow")
    assert await store.execution_reconcile_apply([flag]) == [flag]
    # none of these is a running delegated execution
    await running(store)
    await submit_unique(store)
    await completed(store)
    ended = await attached(store, "run-ended")
    assert (await store.execution_callback(ended, TOKEN, COMPLETE, 1)).outcome == "applied"
    cancelled = await delegated(store)
    assert (await operator_ends(store, cancelled)).changed

    everything = await store.execution_external_running()

    assert [e.id for e in everything] == ids
    assert everything == [await get(store, i) for i in ids]
    assert all(e.status == Status.RUNNING and e.engine == ENGINE for e in everything)

    # keyset pages of 3: every row once, in order
    pages: list[list[uuid.UUID]] = []
    after: uuid.UUID | None = None
    while True:
        page = await store.execution_external_running(limit=3, after=after)
        if not page:
            break
        pages.append([e.id for e in page])
        after = page[-1].id
    assert pages == [ids[0:3], ids[3:6], ids[6:7]]
    assert await store.execution_external_running(limit=1) == everything[:1]
    assert await store.execution_external_running(after=ids[-1]) == []
    # ``after`` need not be one of them
    between = uuid.UUID(int=ids[4].int + 1)
    assert between < ids[5]
    assert [e.id for e in await store.execution_external_running(after=between)] == ids[5:]


# -- execution_reconcile_apply -----------------------------------------------------------------


async def test_reconcile_terminate(store: Store, clock: ManualClock) -> None:
    eid = await attached(store, "run-1")
    flag = flag_action(eid, "run-1", "engine unreachable")
    assert await store.execution_reconcile_apply([flag]) == [flag]
    at = clock.advance(60)
    action = end_action(eid, "run-1", "limit of 60s breached",
                             {"limit_s": 60, "engine_status": "running"})

    assert await store.execution_reconcile_apply([action]) == [action]

    ex = await get(store, eid)
    assert (ex.status, ex.updated_at, ex.result) == (Status.FAILED_TRANSIENT, at, None)
    assert ex.error == {"code": "reconciler", "message": "limit of 60s breached",
                        "limit_s": 60, "engine_status": "running"}
    assert (ex.flagged_at, ex.flag_reason) == (None, None)  # ended: no operator needed
    events = await assert_history_consistent(store, eid)
    assert kinds(events)[-2:] == ["flagged", "failed_transient"]
    assert events[-1].data == {"by": "reconciler", "reason": "limit of 60s breached",
                               "limit_s": 60, "engine_status": "running"}
    assert events[-1].at == at

    # the same action again: the execution is no longer running, nothing happens
    before = await snapshot(store, eid)
    assert await store.execution_reconcile_apply([action]) == []
    await assert_unchanged(store, eid, before)


async def test_reconcile_terminate_a_run_that_never_got_an_id(store: Store) -> None:
    eid = await delegated(store)
    action = end_action(eid, None, "no run found in the engine")
    assert await store.execution_reconcile_apply([action]) == [action]
    ex = await get(store, eid)
    assert ex.status == Status.FAILED_TRANSIENT
    assert ex.error == {"code": "reconciler", "message": "no run found in the engine"}
    await assert_history_consistent(store, eid)


async def test_reconcile_flag(store: Store, clock: ManualClock) -> None:
    eid = await attached(store, "run-1")
    before = await get(store, eid)
    at = clock.advance(10)
    action = flag_action(eid, "run-1", "engine says: unknown run", {"tries": 3})

    assert await store.execution_reconcile_apply([action]) == [action]

    ex = await get(store, eid)
    assert ex == dataclasses.replace(before, flagged_at=at, flag_reason="engine says: unknown run",
                                     flag_kind="unknown_id",
                                     history_seq=before.history_seq + 1)
    events = await assert_history_consistent(store, eid)
    assert (events[-1].kind, events[-1].at) == ("flagged", at)
    assert events[-1].data == {"by": "reconciler", "reason": "engine says: unknown run",
                               "tries": 3, "flag_kind": "unknown_id"}
    assert [e.id for e in await store.execution_list(ExecutionFilter(flagged=True),
                                                     limit=10)] == [eid]

    # the identical flag again (next tick) is not applied twice
    snap = await snapshot(store, eid)
    clock.advance(10)
    assert await store.execution_reconcile_apply([action]) == []
    await assert_unchanged(store, eid, snap)
    assert (await get(store, eid)).flagged_at == at

    # a new reason (or kind) replaces the old one
    at2 = clock.advance(10)
    newer = flag_action(eid, "run-1", "limit breached; the engine did not confirm the stop",
                        kind=FlagKind.STOP_UNCONFIRMED)
    assert await store.execution_reconcile_apply([newer]) == [newer]
    ex = await get(store, eid)
    assert (ex.status, ex.flagged_at, ex.flag_reason, ex.flag_kind) == (
        Status.RUNNING, at2, "limit breached; the engine did not confirm the stop",
        "stop_unconfirmed")
    events = await assert_history_consistent(store, eid)
    assert kinds(events)[-2:] == ["flagged", "flagged"]
    # a new reason alone (the same kind) replaces the old one too ...
    reworded = flag_action(eid, "run-1", "cancel requested; the engine did not confirm the stop",
                           kind=FlagKind.STOP_UNCONFIRMED)
    assert await store.execution_reconcile_apply([reworded]) == [reworded]
    assert (await get(store, eid)).flag_reason == reworded.reason
    # ... and so does a new kind alone (the same words)
    rekinded = flag_action(eid, "run-1", reworded.reason, kind=FlagKind.UNKNOWN_ID)
    assert await store.execution_reconcile_apply([rekinded]) == [rekinded]
    assert (await get(store, eid)).flag_kind == "unknown_id"
    assert await store.execution_reconcile_apply([newer]) == [newer]  # back as it was
    events = await assert_history_consistent(store, eid)
    assert kinds(events)[-3:] == ["flagged", "flagged", "flagged"]

    # the engine finds the run again: the flag is cleared, the run goes on
    at3 = clock.advance(10)
    clear = ReconcileAction(eid, "run-1", WriteKind.UNFLAG, "found", {"engine_status": "running"})
    assert await store.execution_reconcile_apply([clear]) == [clear]
    ex = await get(store, eid)
    assert (ex.status, ex.flagged_at, ex.flag_reason, ex.flag_kind) == (
        Status.RUNNING, None, None, None)
    events = await assert_history_consistent(store, eid)
    assert (events[-1].kind, events[-1].at) == ("unflagged", at3)
    assert events[-1].data == {
        "by": "reconciler", "reason": "found", "engine_status": "running",
        "was": {"flag_kind": "stop_unconfirmed",
                "flag_reason": "limit breached; the engine did not confirm the stop"}}
    assert await store.execution_list(ExecutionFilter(flagged=True), limit=10) == []
    # clearing a flag that is not there changes nothing
    snap = await snapshot(store, eid)
    assert await store.execution_reconcile_apply([clear]) == []
    await assert_unchanged(store, eid, snap)


async def test_reconcile_flag_without_id_keeps_the_first_reason(
    store: Store, clock: ManualClock
) -> None:
    """The trigger's own flag (outcome unknown) is more specific than the reconciler's
    later "no external id": it is kept."""
    eid = await delegated(store)
    first = flag_action(eid, None, "the trigger's outcome is unknown",
                        kind=FlagKind.TRIGGER_UNKNOWN)
    at = clock.now()
    assert await store.execution_reconcile_apply([first]) == [first]
    before = await snapshot(store, eid)
    clock.advance(60)
    later = flag_action(eid, None, "no external id after 60s")
    assert await store.execution_reconcile_apply([later, first]) == []
    await assert_unchanged(store, eid, before)
    # the kept reason skips only its own execution: the rest of the page is applied
    other = await delegated(store)
    theirs = flag_action(other, None, "no external id after 60s")
    assert await store.execution_reconcile_apply([later, theirs]) == [theirs]
    await assert_unchanged(store, eid, before)
    assert (await get(store, other)).flag_kind == "no_external_id"
    ex = await get(store, eid)
    assert (ex.flagged_at, ex.flag_reason, ex.flag_kind) == (
        at, "the trigger's outcome is unknown", "trigger_unknown")


async def test_actions_with_nothing_to_change_skip_only_their_own_execution(
    store: Store
) -> None:
    """In one page, a flag an execution already carries and the clearing of a flag an
    execution does not carry change nothing, and the actions after them still apply."""
    flagged = await attached(store, "run-a")
    same = flag_action(flagged, "run-a", "engine says: unknown run")
    assert await store.execution_reconcile_apply([same]) == [same]
    unflagged = await attached(store, "run-c")
    nothing_to_clear = ReconcileAction(unflagged, "run-c", WriteKind.UNFLAG, "found", {})
    last = await attached(store, "run-b")
    new_flag = flag_action(last, "run-b", "engine says: unknown run")
    before = [await snapshot(store, eid) for eid in (flagged, unflagged)]

    assert await store.execution_reconcile_apply([same, nothing_to_clear, new_flag]) == [
        new_flag]

    for eid, snap in zip((flagged, unflagged), before, strict=True):
        await assert_unchanged(store, eid, snap)
    assert (await get(store, last)).flag_kind == "unknown_id"


SKIPS = ["other_id", "id_now_known", "id_expected_none_missing", "ended", "plain_running",
         "pending", "unknown"]


@pytest.mark.parametrize("how", SKIPS)
@pytest.mark.parametrize("kind", list(WriteKind))
async def test_reconcile_skips_an_action_that_no_longer_applies(
    store: Store, clock: ManualClock, how: str, kind: WriteKind
) -> None:
    if how == "other_id":
        eid, seen = await attached(store, "run-new"), "run-old"
    elif how == "id_now_known":  # attached since the tick looked
        eid, seen = await attached(store, "run-1"), None
    elif how == "id_expected_none_missing":
        eid, seen = await delegated(store), "run-1"
    elif how == "ended":
        eid, seen = await attached(store, "run-1"), "run-1"
        assert (await store.execution_callback(eid, TOKEN, COMPLETE, 1)).outcome == "applied"
    elif how == "plain_running":  # a worker's run: no engine, no external id
        eid, seen = (await running(store)).execution_id, None
    elif how == "pending":
        eid, seen = (await submit_unique(store)).id, None
    else:
        eid, seen = uuid.uuid4(), None
    before = await snapshot(store, eid) if how != "unknown" else None
    clock.advance(1)

    applied = await store.execution_reconcile_apply(
        [ReconcileAction(eid, seen, kind, "stale decision",
                         flag=FlagKind.UNKNOWN_ID if kind is WriteKind.FLAG else None)])

    assert applied == []
    if before is None:
        assert await store.execution_get(eid) is None
        assert await store.history_list(eid) == []
    else:
        await assert_unchanged(store, eid, before)


async def test_reconcile_with_nothing_to_do(store: Store) -> None:
    assert await store.execution_reconcile_apply([]) == []


async def test_reconcile_writes_an_execution_once_per_call(store: Store) -> None:
    """An action repeated within one call is applied once (one event, one seq)."""
    a = await attached(store, "run-a")
    b = await attached(store, "run-b")
    flag_a = flag_action(a, "run-a", "slow")
    end_b = end_action(b, "run-b", "gone")
    flag_b = flag_action(b, "run-b", "slow")

    applied = await store.execution_reconcile_apply([flag_a, end_b, flag_a, end_b, flag_b])

    assert applied == [flag_a, end_b]
    ex_a, ex_b = await get(store, a), await get(store, b)
    assert (ex_a.status, ex_a.flag_reason) == (Status.RUNNING, "slow")
    assert (ex_b.status, ex_b.flagged_at) == (Status.FAILED_TRANSIENT, None)
    assert kinds(await assert_history_consistent(store, a))[-2:] == [
        "external_started", "flagged"]
    assert kinds(await assert_history_consistent(store, b))[-2:] == [
        "external_started", "failed_transient"]


async def test_reconcile_applies_many_mixed_actions_in_one_call(
    store: Store, clock: ManualClock
) -> None:
    terminate = [await attached(store, f"run-t{i}") for i in range(15)]
    flag = [await attached(store, f"run-f{i}") for i in range(15)]
    other_id = [await attached(store, f"run-o{i}") for i in range(5)]
    ended = [await attached(store, f"run-e{i}") for i in range(5)]
    for eid in ended:
        assert (await operator_ends(store, eid, "fail")).changed
    plain = [(await running(store)).execution_id for _ in range(5)]
    unknown = [uuid.uuid4() for _ in range(5)]

    actions = (
        [end_action(e, f"run-t{i}", f"breach {i}", {"i": i},
                    to=Status.CANCELLED if i % 2 else Status.FAILED_TRANSIENT)
         for i, e in enumerate(terminate)]
        + [flag_action(e, f"run-f{i}", f"stuck {i}", {"i": i})
           for i, e in enumerate(flag)]
        + [end_action(e, f"run-x{i}", "stale", {}) for i, e in
           enumerate(other_id)]
        + [flag_action(e, f"run-e{i}", "stale", {}) for i, e in enumerate(ended)]
        + [end_action(e, None, "stale", {}) for e in plain]
        + [flag_action(e, None, "stale", {}) for e in unknown]
    )
    assert len(actions) == 50
    random.Random(7).shuffle(actions)
    skipped = [*other_id, *ended, *plain]
    before = {eid: await snapshot(store, eid) for eid in skipped}
    at = clock.advance(30)

    applied = await store.execution_reconcile_apply(actions)

    applies = {*terminate, *flag}
    assert applied == [a for a in actions if a.execution_id in applies]
    assert len(applied) == 30
    for i, eid in enumerate(terminate):
        ex = await get(store, eid)
        to = Status.CANCELLED if i % 2 else Status.FAILED_TRANSIENT
        assert (ex.status, ex.updated_at) == (to, at)
        assert ex.error == (None if i % 2 else
                            {"code": "reconciler", "message": f"breach {i}", "i": i})
        events = await assert_history_consistent(store, eid)
        assert (events[-1].kind, events[-1].data) == (
            str(to), {"by": "reconciler", "reason": f"breach {i}", "i": i})
    for i, eid in enumerate(flag):
        ex = await get(store, eid)
        assert (ex.status, ex.flagged_at, ex.flag_reason, ex.flag_kind) == (
            Status.RUNNING, at, f"stuck {i}", "unknown_id")
        events = await assert_history_consistent(store, eid)
        assert (events[-1].kind, events[-1].data) == (
            "flagged", {"by": "reconciler", "reason": f"stuck {i}", "i": i,
                        "flag_kind": "unknown_id"})
    for eid in skipped:
        await assert_unchanged(store, eid, before[eid])
    for eid in unknown:
        assert await store.execution_get(eid) is None
    assert {e.id for e in await store.execution_external_running()} == {*flag, *other_id}


async def test_reconcile_apply_is_one_transaction(store: Store) -> None:
    """An action the store cannot apply undoes the whole tick."""
    a = await attached(store, "run-a")
    b = await attached(store, "run-b")
    before = {eid: await snapshot(store, eid) for eid in (a, b)}
    with pytest.raises(ValueError, match="unknown reconciler action"):
        await store.execution_reconcile_apply([
            end_action(a, "run-a", "breach"),
            ReconcileAction(b, "run-b", cast(Any, "restart"), "?"),
        ])
    for eid in (a, b):
        await assert_unchanged(store, eid, before[eid])


async def test_reconcile_apply_is_undone_when_history_insert_fails(
    store: Store, raw: RawSQL
) -> None:
    a = await attached(store, "run-a")
    b = await attached(store, "run-b")
    actions = [end_action(a, "run-a", "breach"),
               flag_action(b, "run-b", "slow")]
    before = {eid: await snapshot(store, eid) for eid in (a, b)}
    with raw.history_insert_fails(), pytest.raises(DB_ERRORS, match="boom"):
        await store.execution_reconcile_apply(actions)
    for eid in (a, b):
        await assert_unchanged(store, eid, before[eid])
    assert await store.execution_reconcile_apply(actions) == actions


# -- execution_resolve ---------------------------------------------------------------------------


async def test_resolve_attach(store: Store) -> None:
    eid = await delegated(store)
    flag = flag_action(eid, None, "the trigger's outcome is unknown")
    assert await store.execution_reconcile_apply([flag]) == [flag]
    before = await get(store, eid)

    res = await store.execution_resolve(eid, action=ResolveAction.ATTACH, external_id="run-9",
                                        reason="found in the engine", actor="ops@example")

    ex = await get(store, eid)
    assert res == ControlResult(ex, changed=True)
    assert ex == dataclasses.replace(before, external_execution_id="run-9", flagged_at=None,
                                     flag_reason=None, flag_kind=None,
                                     history_seq=before.history_seq + 1)
    assert ex.status == Status.RUNNING
    events = await assert_history_consistent(store, eid)
    assert events[-1].kind == "external_started"
    assert events[-1].data == {"external_execution_id": "run-9", "by": "ops@example",
                               "reason": "found in the engine"}

    # it has an id now: another attach is refused, and changes nothing
    snap = await snapshot(store, eid)
    res = await store.execution_resolve(eid, action=ResolveAction.ATTACH, external_id="run-10",
                                        reason="again", actor="ops@example")
    assert res == ControlResult(ex, refused="execution already has an external id (run-9)")
    await assert_unchanged(store, eid, snap)


@pytest.mark.parametrize(("action", "to"), [("fail", Status.FAILED_TRANSIENT),
                                            ("cancel", Status.CANCELLED)])
async def test_resolve_with_an_id_records_the_request_and_ends_nothing(
    store: Store, clock: ManualClock, action: str, to: Status
) -> None:
    """With an external id, an operator's fail/cancel is a request: the execution stays
    running with it until a look finds the engine run finished (docs/external.md)."""
    eid = await attached(store, "run-1")
    assert await store.execution_reconcile_apply([flag_action(eid, "run-1", "stuck")])
    before = await get(store, eid)
    at = clock.advance(5)

    res = await store.execution_resolve(eid, action=ResolveAction(action), external_id=None,
                                        reason="customer withdrew", actor="ops@example",
                                        expected_external_id="run-1")

    ex = await get(store, eid)
    assert res == ControlResult(ex, changed=True)
    assert ex == dataclasses.replace(
        before, end_request={"action": action, "reason": "customer withdrew",
                             "by": "ops@example"},
        end_requested_at=at, history_seq=before.history_seq + 1)
    assert ex.status == Status.RUNNING and ex.flag_kind == "unknown_id"
    events = await assert_history_consistent(store, eid)
    assert (events[-1].kind, events[-1].at) == ("end_requested", at)
    assert events[-1].data == {"action": action, "by": "ops@example",
                               "reason": "customer withdrew",
                               "external_execution_id": "run-1", "ends_as": str(to)}

    # once the engine confirms, the look's end applies: the operator's outcome
    later = clock.advance(5)
    end = ReconcileAction(eid, "run-1", WriteKind.TERMINATE, "confirmed", {"resolved": True},
                          to=to, error={"code": "operator", "message": "customer withdrew",
                                        "by": "ops@example", "engine_confirmed": True})
    assert await store.execution_reconcile_apply([end]) == [end]
    ex = await get(store, eid)
    assert (ex.status, ex.updated_at, ex.end_request, ex.end_requested_at, ex.flag_kind) == (
        to, later, None, None, None)
    assert ex.error == ({"code": "operator", "message": "customer withdrew",
                         "by": "ops@example", "engine_confirmed": True}
                        if to == Status.FAILED_TRANSIENT else None)
    await assert_history_consistent(store, eid)


@pytest.mark.parametrize(("action", "to"), [("fail", Status.FAILED_TRANSIENT),
                                            ("cancel", Status.CANCELLED)])
@pytest.mark.parametrize("with_id", [True, False], ids=["attached", "without_id"])
async def test_resolve_unconfirmed_ends_the_run_and_keeps_it_flagged_as_forced(
    store: Store, clock: ManualClock, action: str, to: Status, with_id: bool
) -> None:
    eid = await (attached(store, "run-1") if with_id else delegated(store))
    assert await store.execution_reconcile_apply(
        [flag_action(eid, "run-1" if with_id else None, "stuck")])
    at = clock.advance(5)

    res = await store.execution_resolve(
        eid, action=ResolveAction(action), external_id=None, reason="run deleted in the engine",
        actor="ops@example", expected_external_id="run-1" if with_id else None,
        unconfirmed="the engine is unreachable")

    ex = await get(store, eid)
    assert res == ControlResult(ex, changed=True)
    assert (ex.status, ex.updated_at, ex.result) == (to, at, None)
    assert ex.error == ({"code": "operator", "message": "run deleted in the engine",
                         "by": "ops@example", "engine_confirmed": False}
                        if to == Status.FAILED_TRANSIENT else None)
    assert (ex.flagged_at, ex.flag_kind) == (at, "forced")
    assert ex.flag_reason == (f"ended {to} by ops@example without the engine's confirmation "
                              "(the engine is unreachable): check the run in the engine")
    events = await assert_history_consistent(store, eid)
    assert (events[-1].kind, events[-1].at) == (str(to), at)
    assert events[-1].data == {
        "by": "ops@example", "reason": "run deleted in the engine", "resolved": True,
        "engine_confirmed": False, "why_unconfirmed": "the engine is unreachable",
        "external_execution_id": "run-1" if with_id else None}
    # terminal, yet on the flagged list: the run may still be going in the engine
    assert [e.id for e in await store.execution_list(ExecutionFilter(flagged=True),
                                                     limit=10)] == [eid]
    assert await store.execution_flag_counts() == {"forced": 1}


async def test_resolve_refuses_to_end_on_a_stale_external_id(
    store: Store, clock: ManualClock
) -> None:
    """The request was decided on one external id; if the execution has another now (an id
    attached meanwhile), nothing ends: the operator must look again."""
    eid = await delegated(store)
    assert (await store.execution_record_external_id(eid, "run-1")).changed
    before = await snapshot(store, eid)
    clock.advance(1)
    for unconfirmed in (None, "no external id"):
        res = await store.execution_resolve(
            eid, action=ResolveAction.FAIL, external_id=None, reason="r", actor="ops",
            expected_external_id=None, unconfirmed=unconfirmed)
        assert res == ControlResult(
            before[0], code="engine_not_confirmed",
            refused="its external id changed meanwhile (now run-1): resolve it again")
    await assert_unchanged(store, eid, before)


async def test_resolve_request_needs_an_external_id(store: Store, clock: ManualClock) -> None:
    eid = await delegated(store)
    before = await snapshot(store, eid)
    clock.advance(1)
    res = await store.execution_resolve(eid, action=ResolveAction.CANCEL, external_id=None,
                                        reason="r", actor="ops", expected_external_id=None)
    assert res == ControlResult(before[0], code="engine_not_confirmed",
                                refused="it has no external id: the engine cannot confirm "
                                "anything")
    await assert_unchanged(store, eid, before)


RESOLVE_REFUSALS = [
    ("plain_running", "execution is running, not delegated to an engine"),
    ("pending", "execution is pending, not delegated to an engine"),
    ("completed", "execution is completed, not delegated to an engine"),
    ("ended_by_callback", "execution is completed"),
    ("resolved", "execution is cancelled"),
]


@pytest.mark.parametrize(("how", "refused"), RESOLVE_REFUSALS,
                         ids=[r[0] for r in RESOLVE_REFUSALS])
@pytest.mark.parametrize("action", ["attach", "fail", "cancel"])
async def test_resolve_refused_unless_running_and_delegated(
    store: Store, clock: ManualClock, how: str, refused: str, action: str
) -> None:
    eid = await in_state(store, how)
    before = await snapshot(store, eid)
    clock.advance(1)

    res = await store.execution_resolve(eid, action=ResolveAction(action), external_id="run-x",
                                        reason="why", actor="ops@example",
                                        unconfirmed=None if action == "attach" else "forced")

    assert res == ControlResult(before[0], refused=refused)
    await assert_unchanged(store, eid, before)


async def test_resolve_of_an_unknown_execution(store: Store) -> None:
    unknown = uuid.uuid4()
    for action in ("attach", "fail", "cancel"):
        res = await store.execution_resolve(unknown, action=ResolveAction(action),
                                            external_id="run-1", reason="r", actor="ops")
        assert res == ControlResult(None)
    assert await store.history_list(unknown) == []


async def test_resolve_rejects_bad_requests(store: Store) -> None:
    eid = await delegated(store)
    before = await snapshot(store, eid)
    with pytest.raises(ValueError, match="unknown resolution"):
        await store.execution_resolve(eid, action=cast(Any, "complete"), external_id=None,
                                      reason="r",
                                      actor="ops")
    with pytest.raises(ValueError, match="cannot be unconfirmed"):
        await store.execution_resolve(eid, action=ResolveAction.ATTACH, external_id="run-1",
                                      reason="r", actor="ops", unconfirmed="forced")
    for missing in (None, ""):
        with pytest.raises(ValueError, match="external id"):
            await store.execution_resolve(eid, action=ResolveAction.ATTACH, external_id=missing,
                                          reason="r", actor="ops")
    await assert_unchanged(store, eid, before)


# -- execution_checkpoint_many_if_owned ---------------------------------------------------------


async def test_checkpoint_many_journals_every_owned_execution(
    store: Store, clock: ManualClock
) -> None:
    claims = [await running(store, "w") for _ in range(3)]
    before = [await get(store, c.execution_id) for c in claims]
    at = clock.advance(2)
    items: list[tuple[Claim, str, Any]] = [
        (claims[0], "step_completed", {"step": "s0", "result": [0, {"ü": None}]}),
        (claims[1], "timer_started", {"pos": 1}),
        (claims[2], "step_completed", None),
    ]

    results = await store.execution_checkpoint_many_if_owned("w", items)

    assert results == [TransitionResult(True, None)] * 3
    for (c, kind, data), old in zip(items, before, strict=True):
        ex = await get(store, c.execution_id)
        # a journal event changes no state: only the history grows
        assert ex == dataclasses.replace(old, history_seq=old.history_seq + 1)
        events = await assert_history_consistent(store, c.execution_id)
        assert (events[-1].kind, events[-1].data, events[-1].at, events[-1].seq) == (
            kind, data, at, old.history_seq + 1)
    assert await store.execution_checkpoint_many_if_owned("w", []) == []
    # the runs go on: their leases still hold
    assert all([(await store.execution_complete_if_owned(c, "done")).applied for c in claims])


async def test_checkpoint_many_refuses_stale_claims_in_the_batch(
    store: Store, clock: ManualClock
) -> None:
    expired = await running(store, "w")
    clock.advance(TTL / 2)
    ok = await running(store, "w")
    stale = await running(store, "w")
    assert (await store.execution_release_if_owned(stale, "again")).applied
    current = await claim_exactly(store, stale.execution_id, "w")
    handed_over = await running(store, "w")
    await delegate(store, handed_over)
    done = await running(store, "w")
    assert (await store.execution_complete_if_owned(done, 1)).applied
    unknown = Claim(uuid.uuid4(), "w", 1)
    clock.advance(TTL / 2)  # ``expired`` reaches its expiry, the others hold
    refused = {c.execution_id: await snapshot(store, c.execution_id)
               for c in (expired, stale, handed_over, done)}
    ok_before = await get(store, ok.execution_id)

    items: list[tuple[Claim, str, Any]] = [
        (expired, "step_completed", {"n": 0}),
        (ok, "step_completed", {"n": 1}),
        (stale, "step_completed", {"n": 2}),
        (handed_over, "step_completed", {"n": 3}),
        (done, "step_completed", {"n": 4}),
        (unknown, "step_completed", {"n": 5}),
        (ok, "step_completed", {"n": 6}),  # the same execution again: refused
    ]
    results = await store.execution_checkpoint_many_if_owned("w", items)

    assert [r.applied for r in results] == [False, True, False, False, False, False, False]
    assert results[1] == TransitionResult(True, None)
    assert results[5] == TransitionResult(False, None, "execution does not exist")
    reasons = {expired.execution_id: "lease expired", stale.execution_id: STALE,
               handed_over.execution_id: STALE, done.execution_id: "execution is completed"}
    for r, (claim, kind, data) in zip(results, items, strict=True):
        if claim.execution_id not in reasons:
            continue
        assert r.reason == reasons[claim.execution_id]
        assert r.execution == await get(store, claim.execution_id)
        late = await assert_kept_as_late_report(store, refused[claim.execution_id])
        assert late.data == {"report": kind, "owner": "w", "epoch": claim.epoch,
                             "payload": data, "reason": reasons[claim.execution_id]}
    assert (await get(store, stale.execution_id)).lease_epoch == current.epoch
    assert await store.history_list(unknown.execution_id) == []

    # the owned one got its event once; the repeat is kept as a late report after it
    ex = await get(store, ok.execution_id)
    assert ex == dataclasses.replace(ok_before, history_seq=ok_before.history_seq + 2)
    assert ex.status == Status.RUNNING
    events = await assert_history_consistent(store, ok.execution_id)
    assert kinds(events)[-2:] == ["step_completed", "late_report"]
    assert events[-2].data == {"n": 1}
    assert results[6].execution is not None
    assert (events[-1].data["report"], events[-1].data["payload"]) == (
        "step_completed", {"n": 6})
    assert results[6].reason == events[-1].data["reason"] == REPEATED_IN_BATCH


async def test_checkpoint_many_rejects_a_bad_batch_whole(store: Store) -> None:
    mine = await running(store, "w")
    theirs = await running(store, "other")
    before = {c.execution_id: await snapshot(store, c.execution_id) for c in (mine, theirs)}
    with pytest.raises(ValueError, match="owner"):
        await store.execution_checkpoint_many_if_owned(
            "w", [(mine, "step_completed", 1), (theirs, "step_completed", 2)])
    for reserved in ("completed", "late_report", ""):
        with pytest.raises(ValueError, match="journal event kind"):
            await store.execution_checkpoint_many_if_owned(
                "w", [(mine, "step_completed", 1), (mine, reserved, 2)])
    for eid, snap in before.items():
        await assert_unchanged(store, eid, snap)


async def test_checkpoint_many_fails_whole_when_history_insert_fails(
    store: Store, raw: RawSQL
) -> None:
    claims = [await running(store, "w") for _ in range(3)]
    items = [(c, "step_completed", {"i": i}) for i, c in enumerate(claims)]
    before = {c.execution_id: await snapshot(store, c.execution_id) for c in claims}
    with raw.history_insert_fails(), pytest.raises(DB_ERRORS, match="boom"):
        await store.execution_checkpoint_many_if_owned("w", items)
    for eid, snap in before.items():
        await assert_unchanged(store, eid, snap)
    results = await store.execution_checkpoint_many_if_owned("w", items)
    assert results == [TransitionResult(True, None)] * 3


async def test_a_late_id_for_a_forced_end_is_surfaced_on_the_flagged_list(
    store: Store, clock: ManualClock
) -> None:
    """An operator ended a run whose trigger had not answered (no id: the operator's word);
    the engine's id arriving afterwards is kept as a late report AND said on the flagged
    list, since the run exists and may still be going."""
    eid = await delegated(store)
    assert (await operator_ends(store, eid, "fail")).changed
    clock.advance(1)

    res = await store.execution_record_external_id(eid, "run-9")

    assert not res.changed and res.refused is not None
    ex = await get(store, eid)
    assert ex.status == Status.FAILED_TRANSIENT and ex.flag_kind == "forced"
    assert ex.flag_reason is not None and ex.flag_reason.endswith(
        "; the engine's id run-9 arrived afterwards: its run exists and may still be going, "
        "check it in the engine")
    assert (await assert_history_consistent(store, eid))[-1].kind == "late_report"
    assert [e.id for e in await store.execution_list(ExecutionFilter(flagged=True),
                                                     limit=10)] == [eid]
