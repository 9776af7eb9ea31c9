"""Lease recovery's decision (veracity.core.recovery), over every combination of what it
looks at."""

from __future__ import annotations

import itertools

import pytest

from veracity.core.recovery import (
    Expired,
    RecoveryAction,
    RecoveryDecision,
    Registered,
    decide_recovery,
    gone_workers,
)
from veracity.core.states import Status

ATTEMPTS = range(1, 8)
MAX_ATTEMPTS = range(1, 6)
CHILDREN = (0, 1, 3)


def expected(attempt: int, max_attempts: int, cancel: bool, children: int
             ) -> tuple[RecoveryAction, Status, int]:
    """docs/workers.md's table, written out independently of the implementation."""
    if cancel:
        return (RecoveryAction.CANCEL, Status.BLOCKED if children else Status.CANCELLED,
                attempt)
    if attempt < max_attempts:
        return RecoveryAction.RETRY, Status.PENDING, attempt + 1
    return RecoveryAction.FAILED_TRANSIENT, Status.FAILED_TRANSIENT, attempt


def test_every_combination() -> None:
    combos = list(itertools.product(ATTEMPTS, MAX_ATTEMPTS, [True, False], CHILDREN))
    assert len(combos) == 7 * 5 * 2 * 3
    for attempt, max_attempts, cancel, children in combos:
        d = decide_recovery(Expired("w1", attempt, max_attempts, cancel, children))
        assert (d.action, d.status, d.attempt) == expected(attempt, max_attempts, cancel,
                                                           children)
        assert d.status is not Status.COMPLETED  # only the owner, with the result
        if d.action is RecoveryAction.FAILED_TRANSIENT:
            assert d.error == {"code": "lease_expired", "message":
                               f"lease of w1 expired on attempt {attempt} of {max_attempts}"}
        else:
            assert d.error is None


def test_the_decision_is_pure_and_frozen() -> None:
    e = Expired("w", 2, 5, False, 0)
    assert decide_recovery(e) == decide_recovery(e) == RecoveryDecision(
        RecoveryAction.RETRY, Status.PENDING, 3, None)
    with pytest.raises(AttributeError):
        decide_recovery(e).status = Status.CANCELLED  # type: ignore[misc]


def test_what_recovery_read_is_a_value() -> None:
    """An ``Expired`` is what the store read: the decision is made from it and nothing may
    change it in between (the store applies the decision only to the lease it looked at)."""
    e = Expired("w", 2, 5, False, 0)
    with pytest.raises(AttributeError):
        e.cancel_requested = True  # type: ignore[misc]
    assert e == Expired("w", 2, 5, False, 0) and hash(e) == hash(Expired("w", 2, 5, False, 0))


def test_max_attempts_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        decide_recovery(Expired("w", 1, 0, False, 0))


def test_action_labels_are_stable() -> None:
    assert [a.value for a in RecoveryAction] == ["retry", "failed_transient", "cancel"]


# -- workers whose process is gone ------------------------------------------------------

HERE = "boot-1/pid:[7]"
KEYS = (HERE, "boot-1/pid:[8]", "boot-2/pid:[7]", None)


def test_gone_workers_over_every_combination() -> None:
    """Same host key, not stopped, not this process, and its pid gone: all four needed."""
    own_pid = 50
    dead_pids = {60}
    workers = [
        Registered(f"w{i}", pid, key, stopped)
        for i, (pid, key, stopped) in enumerate(
            itertools.product((own_pid, 60, 70), KEYS, (False, True)))
    ]
    asked: list[int] = []

    def pid_gone(pid: int) -> bool:
        asked.append(pid)
        return pid in dead_pids

    gone = gone_workers(workers, HERE, own_pid, pid_gone)
    assert [(w.pid, w.host_key, w.stopped) for w in gone] == [(60, HERE, False)]
    # the operating system is asked only about this host's running workers, never itself
    assert sorted(asked) == [60, 70]


def test_no_host_key_here_means_no_worker_is_judged_gone() -> None:
    workers = [Registered("w1", 60, None, False), Registered("w2", 61, HERE, False)]

    def never(pid: int) -> bool:
        raise AssertionError("asked about a pid without a host key")

    assert gone_workers(workers, None, 50, never) == []
