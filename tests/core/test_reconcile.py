"""The decision about a running delegated execution, over every combination of what one
look knows; n8n's classification; limits."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from veracity.config import Settings
from veracity.core.reconcile import (
    DEFAULT_STOP_FLAG_AFTER,
    N8N_ACTIVE_STATUSES,
    N8N_TERMINAL_STATUSES,
    SELF_CLEARING_FLAGS,
    Action,
    Decision,
    EngineState,
    FlagKind,
    Observation,
    OperatorEnd,
    StopCause,
    classify_n8n,
    decide,
    limit_breached,
    stop_cause,
)
from veracity.core.states import Status

F, R, U = EngineState.FINISHED, EngineState.RUNNING, EngineState.UNKNOWN
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
FLAG_AFTER = timedelta(minutes=10)
GRACE = timedelta(seconds=11)
LIMIT = timedelta(minutes=5)
CAUSES = [None, "limit", "cancel", "operator_fail", "operator_cancel"]


def obs(*, has_id: bool = True, in_flight: bool = False, configured: bool = True,
        engine: EngineState = U, unknown_id: bool = False, cause: str | None = None,
        overdue: bool = False, stop_sent: bool = False, flag: FlagKind | None = None
        ) -> Observation:
    """An observation from the dimensions a look can vary along. ``overdue``: the stop
    was first wanted at least ``stop_flag_after`` ago (only meaningful with a cause)."""
    since = NOW - (FLAG_AFTER if overdue else FLAG_AFTER / 2)
    kw: dict[str, Any] = {}
    if cause == "limit":
        kw["max_duration"] = LIMIT
        triggered = since - LIMIT
    else:
        triggered = NOW - timedelta(hours=1)
    # in flight: the trigger was sent less than its grace ago
    grace = timedelta(days=1) if in_flight else GRACE
    if cause == "cancel":
        kw["cancel_requested_at"] = since
    if cause in ("operator_fail", "operator_cancel"):
        kw["operator_end"] = OperatorEnd.FAIL if cause == "operator_fail" else OperatorEnd.CANCEL
        kw["operator_end_at"] = since
    return Observation(now=NOW, has_external_id=has_id, triggered_at=triggered,
                       trigger_grace=grace, engine_configured=configured, engine=engine,
                       unknown_id=unknown_id, stop_flag_after=FLAG_AFTER, stop_sent=stop_sent,
                       flag=flag, **kw)


def expected(has_id: bool, in_flight: bool, configured: bool, engine: EngineState,
             unknown_id: bool, cause: str | None, overdue: bool, stop_sent: bool,
             flag: FlagKind | None) -> tuple[Action, Status | FlagKind | None, bool]:
    """(action, its status or flag kind, clear_flag), written out from docs/external.md's
    rules independently of the implementation's branches."""
    def flag_or_nothing(kind: FlagKind) -> tuple[Action, FlagKind | None, bool]:
        return (Action.NOTHING, None, False) if flag is kind else (Action.FLAG, kind, False)

    if not has_id:  # the table's fourth row: nothing can be asked or stopped
        if in_flight:
            return Action.NOTHING, None, False
        if flag in (FlagKind.NO_EXTERNAL_ID, FlagKind.TRIGGER_UNKNOWN):
            return Action.NOTHING, None, False
        return flag_or_nothing(FlagKind.NO_EXTERNAL_ID)
    if not configured:
        return flag_or_nothing(FlagKind.ENGINE_UNCONFIGURED)
    if engine is F:  # the run is over: end, as the cause says
        to = (Status.CANCELLED if cause in ("cancel", "operator_cancel")
              else Status.FAILED_TRANSIENT)
        return Action.END, to, False
    if engine is U:
        if unknown_id:
            return flag_or_nothing(FlagKind.UNKNOWN_ID)
        if cause is not None and overdue:
            return flag_or_nothing(FlagKind.STOP_UNCONFIRMED)
        return Action.NOTHING, None, False
    clear = flag in SELF_CLEARING_FLAGS or (flag is FlagKind.STOP_UNCONFIRMED and cause is None)
    if cause is None:
        return Action.NOTHING, None, clear
    if not stop_sent:
        return Action.STOP_REMOTE, None, clear
    if overdue:
        return flag_or_nothing(FlagKind.STOP_UNCONFIRMED)
    return Action.NOTHING, None, clear


DIMENSIONS = list(itertools.product(
    [True, False], [True, False], [True, False], list(EngineState), [True, False], CAUSES,
    [True, False], [True, False], [None, *FlagKind]))


def test_every_combination_matches_the_rules() -> None:
    assert len(DIMENSIONS) == 2 * 2 * 2 * 3 * 2 * 5 * 2 * 2 * 7
    for combo in DIMENSIONS:
        has_id, in_flight, configured, engine, unknown_id, cause, overdue, sent, flag = combo
        o = obs(has_id=has_id, in_flight=in_flight, configured=configured, engine=engine,
                unknown_id=unknown_id, cause=cause, overdue=overdue, stop_sent=sent, flag=flag)
        d = decide(o)
        action, what, clear = expected(*combo)
        got = (d.action, d.to if d.action is Action.END else d.flag, d.clear_flag)
        assert got == (action, what, clear), combo
        assert d.reason.strip(), combo
        assert decide(o) == d, combo  # pure: the same observation, the same decision
        if cause is not None and has_id and configured:
            assert d.cause is not None and d.cause.value == cause, combo


def test_truthfulness_only_a_finished_engine_run_with_an_id_allows_a_terminal_state() -> None:
    for combo in DIMENSIONS:
        has_id, _, configured, engine, *_ = combo
        d = decide(obs(has_id=has_id, configured=configured, engine=engine))
        assert (d.action is Action.END) == (has_id and configured and engine is F), combo
        assert d.to in (None, Status.FAILED_TRANSIENT, Status.CANCELLED)


def test_a_remote_stop_is_asked_only_of_a_running_engine_with_a_reason_to_stop() -> None:
    for combo in DIMENSIONS:
        has_id, in_flight, configured, engine, unknown_id, cause, overdue, sent, flag = combo
        d = decide(obs(has_id=has_id, in_flight=in_flight, configured=configured,
                       engine=engine, unknown_id=unknown_id, cause=cause, overdue=overdue,
                       stop_sent=sent, flag=flag))
        if d.action is Action.STOP_REMOTE:
            assert has_id and configured and engine is R and cause is not None and not sent


def test_the_seed_table_rows() -> None:
    """The four rows of the table in docs/external.md."""
    assert decide(obs(engine=F)).to is Status.FAILED_TRANSIENT  # row 1
    assert decide(obs(engine=R, cause="limit")).action is Action.STOP_REMOTE  # row 2
    assert decide(obs(engine=F, cause="limit")).to is Status.FAILED_TRANSIENT  # row 3
    assert decide(obs(has_id=False, engine=R)).action is Action.FLAG  # row 4


def test_causes_rank_operator_then_cancel_then_limit() -> None:
    everything = dataclasses.replace(
        obs(engine=F, cause="limit"), cancel_requested_at=NOW - timedelta(minutes=1),
        operator_end=OperatorEnd.FAIL, operator_end_at=NOW - timedelta(seconds=5))
    assert stop_cause(everything) == (StopCause.OPERATOR_FAIL, NOW - timedelta(seconds=5))
    assert decide(everything).to is Status.FAILED_TRANSIENT
    no_operator = dataclasses.replace(everything, operator_end=None, operator_end_at=None)
    assert stop_cause(no_operator) == (StopCause.CANCEL, NOW - timedelta(minutes=1))
    assert decide(no_operator).to is Status.CANCELLED
    only_limit = dataclasses.replace(no_operator, cancel_requested_at=None)
    cause = stop_cause(only_limit)
    assert cause is not None and cause[0] is StopCause.LIMIT
    assert only_limit.triggered_at is not None and only_limit.max_duration is not None
    assert cause[1] == only_limit.triggered_at + only_limit.max_duration


def test_an_unconfirmed_stop_is_flagged_exactly_stop_flag_after_it_was_first_wanted() -> None:
    base = obs(engine=R, cause="cancel", stop_sent=True)
    asked = base.cancel_requested_at
    assert asked is not None
    just_before = dataclasses.replace(base, now=asked + FLAG_AFTER - timedelta(microseconds=1))
    at = dataclasses.replace(base, now=asked + FLAG_AFTER)
    assert decide(just_before).action is Action.NOTHING
    flagged = decide(at)
    assert (flagged.action, flagged.flag) == (Action.FLAG, FlagKind.STOP_UNCONFIRMED)
    assert flagged.reason == "cancel requested; the engine did not confirm the stop"
    limit = decide(obs(engine=R, cause="limit", stop_sent=True, overdue=True))
    assert limit.reason == "limit breached; the engine did not confirm the stop"


def test_a_trigger_in_flight_is_not_news_until_its_grace_has_passed() -> None:
    o = obs(has_id=False, engine=U)
    assert o.triggered_at is not None and o.trigger_grace == GRACE
    young = dataclasses.replace(o, triggered_at=NOW - GRACE + timedelta(microseconds=1))
    old = dataclasses.replace(o, triggered_at=NOW - GRACE)
    assert decide(young).action is Action.NOTHING
    assert (decide(old).action, decide(old).flag) == (Action.FLAG, FlagKind.NO_EXTERNAL_ID)
    never = dataclasses.replace(o, triggered_at=None)
    assert decide(never).action is Action.FLAG


def test_reasons_tell_the_cases_apart() -> None:
    reasons = {
        decide(obs(engine=F)).reason,
        decide(obs(engine=F, cause="limit")).reason,
        decide(obs(engine=F, cause="cancel")).reason,
        decide(obs(engine=R, cause="limit")).reason,
        decide(obs(engine=R)).reason,
        decide(obs(engine=U)).reason,
        decide(obs(engine=U, unknown_id=True)).reason,
        decide(obs(has_id=False)).reason,
        decide(obs(configured=False)).reason,
    }
    assert len(reasons) == 9


def test_decision_is_frozen() -> None:
    decision = decide(obs(engine=R, cause="limit"))
    with pytest.raises(AttributeError):
        decision.action = Action.NOTHING  # type: ignore[misc]


def test_an_observation_is_a_value() -> None:
    """A look's observation is decided from as it is; a second look is a new observation
    (``dataclasses.replace``), never the first one changed."""
    o = obs(engine=R, cause="limit")
    with pytest.raises(AttributeError):
        o.engine = F  # type: ignore[misc]
    assert hash(o) == hash(dataclasses.replace(o))


def test_an_observation_says_only_what_it_is_told() -> None:
    """Left out, what the engine said is unknown (not an unknown id), the engine is
    configured, no stop has been sent, and the trigger has no grace: a missing id is news
    from the trigger's own time on."""
    bare = Observation(now=NOW, has_external_id=True)
    nothing = decide(bare)
    assert (nothing.action, nothing.flag) == (Action.NOTHING, None)
    assert nothing.reason == "engine answer unknown: left running, asked again next time"
    running = Observation(now=NOW, has_external_id=True, engine=R)
    assert decide(running).reason == "running within its limit"
    cancelled = Observation(now=NOW, has_external_id=True, engine=R, cancel_requested_at=NOW)
    assert decide(cancelled).action is Action.STOP_REMOTE  # not already sent
    no_id = Observation(now=NOW, has_external_id=False, triggered_at=NOW)
    assert (decide(no_id).action, decide(no_id).flag) == (Action.FLAG, FlagKind.NO_EXTERNAL_ID)
    ahead = Observation(now=NOW, has_external_id=False, triggered_at=NOW + timedelta(seconds=1))
    assert decide(ahead).action is Action.NOTHING


def test_an_unconfirmed_stop_is_flagged_after_ten_minutes_unless_told_otherwise() -> None:
    """``stop_flag_after`` left out is the documented default of
    ``reconciler.stop_flag_after`` (docs/external.md: 10 minutes), the same as the
    configuration's."""
    assert DEFAULT_STOP_FLAG_AFTER.total_seconds() == Settings().reconciler.stop_flag_after
    asked = NOW - timedelta(minutes=10)
    sent = Observation(now=NOW, has_external_id=True, engine=R, cancel_requested_at=asked,
                       stop_sent=True)
    flagged = decide(sent)
    assert (flagged.action, flagged.flag) == (Action.FLAG, FlagKind.STOP_UNCONFIRMED)
    sooner = dataclasses.replace(sent, cancel_requested_at=asked + timedelta(seconds=1))
    assert decide(sooner).action is Action.NOTHING


def test_enum_values_are_stable() -> None:
    assert [s.value for s in EngineState] == ["finished", "running", "unknown"]
    assert [a.value for a in Action] == ["nothing", "end", "stop_remote", "flag"]
    assert [k.value for k in FlagKind] == [
        "no_external_id", "trigger_unknown", "engine_unconfigured", "unknown_id",
        "stop_unconfirmed", "forced"]


def test_decision_carries_no_status_unless_it_ends() -> None:
    assert Decision(Action.NOTHING, "x").to is None


# ---------------------------------------------------------------------------
# n8n's status and stoppedAt

STOPPED = "2030-01-01T00:00:05.000Z"

# Every status n8n's ExecutionStatus type names, plus values it does not, each with and
# without stoppedAt, and the state expected (written independently of the code).
N8N_EXPECTED: dict[tuple[str | None, bool], EngineState] = {
    ("success", True): F,
    ("error", True): F,
    ("canceled", True): F,
    ("crashed", True): F,
    # terminal status without stoppedAt contradicts itself: never finished on that
    ("success", False): U,
    ("error", False): U,
    ("canceled", False): U,
    ("crashed", False): U,
    # a Wait node parks the run with stoppedAt SET: still running (the trap)
    ("waiting", True): R,
    ("waiting", False): R,
    # just after a resume: running with the old stoppedAt still set
    ("running", True): R,
    ("running", False): R,
    ("new", True): R,
    ("new", False): R,
    # unknown, absent or unexpected statuses: unknown
    ("unknown", True): U,
    ("unknown", False): U,
    (None, True): U,
    (None, False): U,
    ("", True): U,
    ("", False): U,
    ("failed", True): U,
    ("warning", True): U,
    ("SUCCESS", True): U,
    ("Success", True): U,
    (" success", True): U,
    ("finished", True): U,
    ("cancelled", True): U,
}


@pytest.mark.parametrize(("status", "has_stopped_at"), list(N8N_EXPECTED))
def test_classify_n8n(status: str | None, has_stopped_at: bool) -> None:
    stopped_at = STOPPED if has_stopped_at else None
    assert classify_n8n(status, stopped_at) is N8N_EXPECTED[(status, has_stopped_at)]


def test_every_n8n_status_is_covered_with_and_without_stopped_at() -> None:
    n8n_statuses = {"canceled", "crashed", "error", "new", "running", "success", "unknown"}
    n8n_statuses.add("waiting")
    for status in n8n_statuses:
        assert (status, True) in N8N_EXPECTED
        assert (status, False) in N8N_EXPECTED
    assert N8N_TERMINAL_STATUSES | N8N_ACTIVE_STATUSES == n8n_statuses - {"unknown"}
    assert not N8N_TERMINAL_STATUSES & N8N_ACTIVE_STATUSES


def test_empty_stopped_at_is_not_set() -> None:
    assert classify_n8n("success", "") is EngineState.UNKNOWN


def test_waiting_run_past_its_limit_is_stopped_remotely_never_just_marked() -> None:
    engine = classify_n8n("waiting", STOPPED)
    assert decide(obs(engine=engine, cause="limit")).action is Action.STOP_REMOTE
    assert decide(obs(engine=engine)).action is Action.NOTHING


# ---------------------------------------------------------------------------
# Limits, from Veracity's own trigger time

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("elapsed", "limit", "expected"),
    [
        (timedelta(minutes=9, seconds=59), timedelta(minutes=10), False),
        (timedelta(minutes=10), timedelta(minutes=10), False),
        (timedelta(minutes=10, microseconds=1), timedelta(minutes=10), True),
        (timedelta(hours=3), timedelta(minutes=10), True),
        (timedelta(0), timedelta(0), False),
        (timedelta(microseconds=1), timedelta(0), True),
        (timedelta(seconds=601), 600, True),
        (timedelta(seconds=600), 600.0, False),
        (timedelta(seconds=1), 0.5, True),
        (timedelta(days=365), None, False),
        # a clock that reads before the trigger (skew) never breaches
        (-timedelta(minutes=5), timedelta(minutes=1), False),
    ],
)
def test_limit_breached(
    elapsed: timedelta, limit: timedelta | float | None, expected: bool
) -> None:
    assert limit_breached(T0, limit, T0 + elapsed) is expected


def test_limit_breached_ignores_time_zones_of_equal_instants() -> None:
    from datetime import timezone

    later = (T0 + timedelta(minutes=11)).astimezone(timezone(timedelta(hours=5)))
    assert limit_breached(T0, timedelta(minutes=10), later) is True


def test_limit_is_measured_from_the_trigger_time_not_the_engine_start() -> None:
    # n8n rewrites startedAt at a resume; only Veracity's trigger time is passed in, so a
    # run resumed a minute ago but triggered an hour ago is past a 10-minute limit.
    resumed_at = T0 + timedelta(minutes=59)
    now = T0 + timedelta(hours=1)
    assert limit_breached(T0, timedelta(minutes=10), now) is True
    assert limit_breached(resumed_at, timedelta(minutes=10), now) is False


@pytest.mark.parametrize(
    ("triggered_at", "now"),
    [
        (T0.replace(tzinfo=None), T0),
        (T0, T0.replace(tzinfo=None)),
    ],
)
def test_limit_breached_refuses_naive_datetimes(triggered_at: datetime, now: datetime) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        limit_breached(triggered_at, 60, now)


@pytest.mark.parametrize("bad", [-1, -0.5, timedelta(seconds=-1), float("nan"), float("inf")])
def test_limit_breached_refuses_bad_limits(bad: timedelta | float) -> None:
    with pytest.raises(ValueError):
        limit_breached(T0, bad, T0)
