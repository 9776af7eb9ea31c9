"""Execution states and the one table of allowed transitions.

Nothing else in Veracity decides whether a state change is allowed: the stores derive
the ``WHERE status IN (...)`` of every guarded UPDATE from :data:`TRANSITIONS`, and the
database's CHECK constraint lists exactly the members of :class:`Status`.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class Status(StrEnum):
    """The state of an execution (docs/states.md)."""

    PENDING = "pending"
    """Waiting to be claimed; claimable once ``scheduled_at <= now``."""

    RUNNING = "running"
    """Held by a worker's lease, or delegated to an external engine."""

    BLOCKED = "blocked"
    """In a durable wait (timer, children, message); holds no lease and no worker."""

    PAUSED = "paused"
    """On operator hold: never claimed until unpaused."""

    COMPLETED = "completed"
    """Terminal. Finished with a result, reported by its owner or by ``/complete``."""

    FAILED = "failed"
    """Terminal. The workflow's own error, after its retries."""

    FAILED_TRANSIENT = "failed_transient"
    """Terminal. Infrastructure gave up: lease lost for the last time, engine crashed or
    went silent, limit breached."""

    CANCELLED = "cancelled"
    """Terminal. Cancelled on request; kept with its history as an audit record."""

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL


TERMINAL: frozenset[Status] = frozenset(
    {Status.COMPLETED, Status.FAILED, Status.FAILED_TRANSIENT, Status.CANCELLED}
)

# The one transition table: state -> the states it may move to.
TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.PENDING: frozenset(
        {Status.RUNNING, Status.PAUSED, Status.CANCELLED, Status.FAILED_TRANSIENT}
    ),
    Status.RUNNING: frozenset(
        {
            Status.PENDING,  # released, or recovered after its lease expired
            Status.BLOCKED,  # entered a durable wait
            Status.PAUSED,  # parked at a step boundary
            Status.COMPLETED,
            Status.FAILED,
            Status.FAILED_TRANSIENT,
            Status.CANCELLED,
        }
    ),
    Status.BLOCKED: frozenset(
        {Status.PENDING, Status.PAUSED, Status.CANCELLED, Status.FAILED_TRANSIENT}
    ),
    Status.PAUSED: frozenset(
        {Status.PENDING, Status.BLOCKED, Status.CANCELLED, Status.FAILED_TRANSIENT}
    ),
    Status.COMPLETED: frozenset(),
    Status.FAILED: frozenset(),
    Status.FAILED_TRANSIENT: frozenset(),
    Status.CANCELLED: frozenset(),
}


class TransitionError(ValueError):
    """A state change that the transition table does not allow."""


def can_transition(source: Status, target: Status) -> bool:
    """True if an execution in ``source`` may move to ``target``."""
    return target in TRANSITIONS[source]


def sources_of(target: Status, among: Iterable[Status] | None = None) -> tuple[Status, ...]:
    """The states from which ``target`` may be entered, optionally restricted to ``among``.

    Stores put the result into the WHERE clause of the guarded UPDATE, so a transition
    that the table forbids can never be written.
    """
    allowed = tuple(s for s in Status if target in TRANSITIONS[s])
    if among is None:
        return allowed
    wanted = set(among)
    bad = wanted - set(allowed)
    if bad:
        names = ", ".join(sorted(bad))
        raise TransitionError(f"{target} cannot be entered from {names}")
    return tuple(s for s in allowed if s in wanted)


def check_transition(source: Status, target: Status) -> None:
    """Raise :class:`TransitionError` unless ``source -> target`` is in the table."""
    if not can_transition(source, target):
        raise TransitionError(f"transition {source} -> {target} is not allowed")
