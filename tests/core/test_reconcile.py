"""The reconciler's decision table, n8n's classification and the limit, every combination."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from veracity.core.reconcile import (
    N8N_ACTIVE_STATUSES,
    N8N_TERMINAL_STATUSES,
    Action,
    Decision,
    EngineState,
    classify_n8n,
    decide,
    limit_breached,
)

F, R, U = EngineState.FINISHED, EngineState.RUNNING, EngineState.UNKNOWN

# Written out by hand from seed 000's table and the issue's refinements, one row per
# combination, independently of the implementation's branches.
EXPECTED: dict[tuple[bool, bool, EngineState], Action] = {
    # seed row 1: id, no breach, engine finished -> terminate locally, no remote stop
    (True, False, F): Action.TERMINATE_LOCAL,
    # implicit: id, no breach, engine still running -> nothing to do
    (True, False, R): Action.NOTHING,
    # implicit: engine answer unknown -> nothing to do
    (True, False, U): Action.NOTHING,
    # seed row 3: id, breach, engine finished -> terminate locally
    (True, True, F): Action.TERMINATE_LOCAL,
    # seed row 2: id, breach, engine running -> stop remotely (terminal later)
    (True, True, R): Action.STOP_REMOTE,
    # implicit: breach but engine answer unknown -> nothing (never terminal on a guess)
    (True, True, U): Action.NOTHING,
    # seed row 4 (and its "any"): no id -> leave running, flag for an operator
    (False, False, F): Action.FLAG,
    (False, False, R): Action.FLAG,
    (False, False, U): Action.FLAG,
    (False, True, F): Action.FLAG,
    (False, True, R): Action.FLAG,
    (False, True, U): Action.FLAG,
}


def test_expected_table_covers_every_combination() -> None:
    combos = set(itertools.product([True, False], [True, False], list(EngineState)))
    assert set(EXPECTED) == combos
    assert len(combos) == 12


@pytest.mark.parametrize(
    ("has_id", "breached", "engine"),
    list(itertools.product([True, False], [True, False], list(EngineState))),
)
def test_decide_matches_the_table(has_id: bool, breached: bool, engine: EngineState) -> None:
    decision = decide(has_id, breached, engine)
    assert isinstance(decision, Decision)
    assert decision.action is EXPECTED[(has_id, breached, engine)]
    assert decision.reason.strip()


@pytest.mark.parametrize(
    ("has_id", "breached", "engine"),
    list(itertools.product([True, False], [True, False], list(EngineState))),
)
def test_truthfulness_only_a_finished_engine_with_an_id_allows_a_terminal_state(
    has_id: bool, breached: bool, engine: EngineState
) -> None:
    terminal = decide(has_id, breached, engine).action is Action.TERMINATE_LOCAL
    assert terminal == (has_id and engine is EngineState.FINISHED)


def test_a_remote_stop_is_asked_only_of_a_running_engine_past_its_limit() -> None:
    stops = {
        combo
        for combo in itertools.product([True, False], [True, False], list(EngineState))
        if decide(*combo).action is Action.STOP_REMOTE
    }
    assert stops == {(True, True, EngineState.RUNNING)}


def test_reasons_tell_the_cases_apart() -> None:
    reasons = {
        decide(True, False, F).reason,
        decide(True, True, F).reason,
        decide(True, True, R).reason,
        decide(True, False, R).reason,
        decide(True, False, U).reason,
        decide(False, False, U).reason,
    }
    assert len(reasons) == 6
    assert "no external execution id" in decide(False, True, R).reason
    assert "unknown" in decide(True, True, U).reason


def test_decision_is_frozen() -> None:
    decision = decide(True, True, R)
    with pytest.raises(AttributeError):
        decision.action = Action.NOTHING  # type: ignore[misc]


def test_enum_values_are_stable() -> None:
    assert [s.value for s in EngineState] == ["finished", "running", "unknown"]
    assert [a.value for a in Action] == ["nothing", "terminate_local", "stop_remote", "flag"]


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
    assert decide(True, True, engine).action is Action.STOP_REMOTE
    assert decide(True, False, engine).action is Action.NOTHING


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
