"""Why an unfinished execution is not finished yet, in words: its ``waiting_reason``
(docs/states.md#why-an-execution-waits). Pure decisions, no I/O: the control plane reads
the facts for a whole page of executions in a few queries and asks :func:`waiting_reason`
for each.

=========  =====================================================================
status     reason
=========  =====================================================================
pending    ``scheduled for T``, or ``ready: waiting for a worker to claim it`` (or,
           when no live worker will claim it, why not)
running    ``held by worker W whose last heartbeat was N s ago, lease expires at T
           and recovery will retry it by T'`` (or what recovery will do instead:
           fail it, cancel it); a worker that is not live (docs/workers.md) is
           said so; a cancel or pause requested is said first; a run delegated
           to an engine: the engine, its run's id, the stop asked of it
blocked    ``asleep until T``; ``waiting for message "topic"``; ``waiting for N
           children (ids)``; a cancelled one waiting for the children it may
           not cancel
paused     ``paused by WHO: WHY`` (or ``submitted paused``), and what it waits for
           once unpaused
=========  =====================================================================

When no live worker will run it (:mod:`veracity.core.deployments`), that is added: ``;
no live worker for deployment D``. Times are UTC, to the second (``2030-01-01T12:00:00Z``).

The worker writes the reason of each durable wait with :func:`sleep_reason`,
:func:`message_reason` and :func:`children_reason` into the ``blocked`` event of the
execution's history, and :func:`parse_block_reason` reads it back.
"""

from __future__ import annotations

import ast
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from veracity.core.recovery import Expired, RecoveryAction, decide_recovery
from veracity.core.states import Status

__all__ = [
    "Children",
    "Facts",
    "Holder",
    "Wait",
    "WaitKind",
    "children_reason",
    "fmt_time",
    "message_reason",
    "parked_reason",
    "parse_block_reason",
    "sleep_reason",
    "waiting_reason",
]

SHOWN_CHILDREN = 5
"""Child ids named in a reason; the others are counted."""

_MESSAGE_PREFIX = "waiting for a message on "
_CHILDREN_PREFIX = "waiting for a child of join set "
_PARKED_AT_WAIT = ("pause requested; parked at its wait (", ")")


class WaitKind(StrEnum):
    SLEEP = "sleep"
    MESSAGE = "message"
    CHILDREN = "children"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Wait:
    """What a blocked execution waits for, as its ``blocked`` event says."""

    kind: WaitKind
    topic: str | None = None
    join_set: str | None = None
    text: str = ""
    """The reason as written (for ``OTHER``: shown as it is)."""


def sleep_reason() -> str:
    return "sleep"


def message_reason(topic: str) -> str:
    return f"{_MESSAGE_PREFIX}{topic!r}"


def children_reason(join_set: str) -> str:
    return f"{_CHILDREN_PREFIX}{join_set}"


def parked_reason(wait_reason: str) -> str:
    """The reason of a ``paused`` event written when a pause requested of a running
    execution takes effect as it enters a durable wait."""
    start, end = _PARKED_AT_WAIT
    return f"{start}{wait_reason}{end}"


def parse_block_reason(reason: str) -> Wait:
    """The wait a ``blocked`` event's reason names (the inverse of the functions above);
    anything else is ``OTHER``, kept as written."""
    if reason == sleep_reason():
        return Wait(WaitKind.SLEEP, text=reason)
    if reason.startswith(_MESSAGE_PREFIX):
        try:
            topic = ast.literal_eval(reason[len(_MESSAGE_PREFIX):])
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            topic = None
        if isinstance(topic, str):
            return Wait(WaitKind.MESSAGE, topic=topic, text=reason)
    if reason.startswith(_CHILDREN_PREFIX) and len(reason) > len(_CHILDREN_PREFIX):
        return Wait(WaitKind.CHILDREN, join_set=reason[len(_CHILDREN_PREFIX):], text=reason)
    return Wait(WaitKind.OTHER, text=reason)


@dataclass(frozen=True, slots=True)
class Holder:
    """The worker whose lease a running execution is under, as the registry knows it."""

    worker_id: str
    last_heartbeat: datetime | None
    """None: no worker of that id is registered."""
    live: bool


@dataclass(frozen=True, slots=True)
class Children:
    """The unfinished children of one join set (or of none: ``join_set`` None)."""

    count: int
    first: tuple[uuid.UUID, ...]
    """Some of them (the oldest first), at most :data:`SHOWN_CHILDREN`."""


@dataclass(frozen=True, slots=True)
class Facts:
    """What :func:`waiting_reason` needs to know about one execution."""

    status: Status
    now: datetime
    """The database's clock."""
    scheduled_at: datetime
    deployment_id: str = ""
    attempt: int = 1
    wake_at: datetime | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    holder: Holder | None = None
    cancel_requested_at: datetime | None = None
    pause_requested_at: datetime | None = None
    paused_from: str | None = None
    engine: str | None = None
    external_execution_id: str | None = None
    triggered_at: datetime | None = None
    flag_reason: str | None = None
    end_requested_at: datetime | None = None
    blocked: Mapping[str, Any] | None = None
    """The data of its newest ``blocked`` event (``reason``): what it waits for."""
    paused: Mapping[str, Any] | None = None
    """The data of its newest ``paused`` event (``by``, ``reason``, ``from``; or, when it
    was submitted paused, the submission's)."""
    pause_requested: Mapping[str, Any] | None = None
    """The data of its newest ``pause_requested`` event (``by``)."""
    children: Mapping[str | None, Children] = field(default_factory=dict)
    """Unfinished children by join set."""
    coverage: str | None = None
    """Why no live worker will run it (:class:`veracity.core.deployments.Coverage`)."""
    recovery_interval: timedelta = timedelta(seconds=30)
    max_attempts: int = 5


def fmt_time(t: datetime) -> str:
    """UTC, to the second."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ago(now: datetime, then: datetime) -> str:
    seconds = (now - then).total_seconds()
    if seconds < 0:
        return "just now"
    return f"{seconds:.0f} s ago" if seconds < 10 else f"{round(seconds)} s ago"


def _ids(count: int, first: Sequence[uuid.UUID]) -> str:
    shown = ", ".join(str(i) for i in first[:SHOWN_CHILDREN])
    more = count - min(len(first), SHOWN_CHILDREN)
    return f"{shown}, and {more} more" if more > 0 and shown else shown


def _children(count: int, first: Sequence[uuid.UUID]) -> str:
    noun = "child" if count == 1 else "children"
    listed = _ids(count, first)
    return f"{count} {noun} ({listed})" if listed else f"{count} {noun}"


def _quoted(topic: str) -> str:
    return json.dumps(topic, ensure_ascii=False)


def waiting_reason(f: Facts) -> str | None:
    """Why it is not finished yet; None for a terminal execution."""
    if f.status.is_terminal:
        return None
    if f.status == Status.PENDING:
        if f.coverage and f.scheduled_at <= f.now:
            return f.coverage  # ready to run: what keeps it waiting is who would run it
        text = _pending(f)
    elif f.status == Status.RUNNING:
        text = _delegated(f) if f.engine is not None else _running(f)
    elif f.status == Status.BLOCKED:
        text = _blocked(f)
    else:
        text = _paused(f)
    return f"{text}; {f.coverage}" if f.coverage else text


def _pending(f: Facts) -> str:
    if f.scheduled_at > f.now:
        return f"scheduled for {fmt_time(f.scheduled_at)}"
    return "ready: waiting for a worker to claim it"


def _interrupts(f: Facts) -> list[str]:
    out = []
    if f.cancel_requested_at is not None:
        out.append(f"cancel requested at {fmt_time(f.cancel_requested_at)}: it stops at "
                   "its next step")
    if f.pause_requested_at is not None:
        out.append(f"pause requested at {fmt_time(f.pause_requested_at)}: it parks at its "
                   "next step")
    return out


def _running(f: Facts) -> str:
    parts = _interrupts(f)
    if f.lease_owner is None or f.lease_expires_at is None:
        return "; ".join([*parts, "running"])
    h = f.holder
    if h is None or h.last_heartbeat is None:
        held = f"held by worker {f.lease_owner}, which is not registered"
    elif h.live:
        held = (f"held by worker {h.worker_id} whose last heartbeat was "
                f"{_ago(f.now, h.last_heartbeat)}")
    else:
        held = (f"held by worker {h.worker_id}, not live (its last heartbeat was "
                f"{_ago(f.now, h.last_heartbeat)})")
    decision = decide_recovery(Expired(
        owner=f.lease_owner, attempt=f.attempt, max_attempts=max(f.max_attempts, 1),
        cancel_requested=f.cancel_requested_at is not None,
        open_children=sum(c.count for c in f.children.values())))
    then = {
        RecoveryAction.RETRY: "retry it",
        RecoveryAction.FAILED_TRANSIENT:
            f"end it failed_transient (attempt {f.attempt} of {f.max_attempts})",
        RecoveryAction.CANCEL: "cancel it",
    }[decision.action]
    by = f.lease_expires_at + f.recovery_interval
    if f.lease_expires_at > f.now:
        lease = (f"lease expires at {fmt_time(f.lease_expires_at)} and recovery will "
                 f"{then} by {fmt_time(by)}")
    elif by > f.now:
        lease = (f"lease expired at {fmt_time(f.lease_expires_at)}; recovery will {then} "
                 f"by {fmt_time(by)}")
    else:
        lease = (f"lease expired at {fmt_time(f.lease_expires_at)} and recovery, due to "
                 f"{then} by {fmt_time(by)}, has not: is any server or worker running?")
    return "; ".join([*parts, f"{held}, {lease}"])


def _delegated(f: Facts) -> str:
    if f.external_execution_id is not None:
        text = f"running in engine {f.engine} as run {f.external_execution_id}"
    else:
        text = f"delegated to engine {f.engine}; its run id is not known yet"
    if f.triggered_at is not None:
        text += f" (triggered at {fmt_time(f.triggered_at)})"
    parts = [text]
    if f.cancel_requested_at is not None or f.end_requested_at is not None:
        at = f.end_requested_at or f.cancel_requested_at
        assert at is not None
        parts.append(f"stop requested at {fmt_time(at)}: waiting for the engine to "
                     "confirm it")
    if f.flag_reason:
        parts.append(f"flagged: {f.flag_reason}")
    return "; ".join(parts)


def _wait(f: Facts) -> str:
    """What a blocked execution (or a paused one, once unpaused) waits for."""
    reason = f.blocked.get("reason") if f.blocked is not None else None
    wait = parse_block_reason(reason) if isinstance(reason, str) else None
    if wait is None or wait.kind == WaitKind.OTHER:
        if f.wake_at is not None:
            return f"asleep until {fmt_time(f.wake_at)}"
        return wait.text if wait is not None and wait.text else "waiting"
    if wait.kind == WaitKind.SLEEP:
        return f"asleep until {fmt_time(f.wake_at)}" if f.wake_at else "asleep"
    if wait.kind == WaitKind.MESSAGE:
        assert wait.topic is not None
        text = f"waiting for message {_quoted(wait.topic)}"
        return f"{text} until {fmt_time(f.wake_at)}" if f.wake_at else text
    c = f.children.get(wait.join_set, Children(0, ()))
    if c.count == 0:
        return (f"waiting for a child of join set {wait.join_set}: each has ended, it is "
                "about to wake")
    return f"waiting for {_children(c.count, c.first)} of join set {wait.join_set}"


def _blocked(f: Facts) -> str:
    if f.cancel_requested_at is not None:
        open_ = sum(c.count for c in f.children.values())
        first = tuple(i for c in f.children.values() for i in c.first)
        return (f"cancel requested at {fmt_time(f.cancel_requested_at)}; waiting for "
                f"{_children(open_, first)} it may not cancel")
    return _wait(f)


def _by(data: Mapping[str, Any] | None) -> str | None:
    who = data.get("by") if data is not None else None
    return who if isinstance(who, str) and who.strip() else None


def _why(data: Mapping[str, Any] | None) -> str | None:
    why = data.get("reason") if data is not None else None
    return why if isinstance(why, str) and why.strip() else None


_REQUESTED = "pause requested; "


def _paused(f: Facts) -> str:
    data = f.paused or {}
    # a running execution that parked itself after a pause was requested: who asked for
    # the pause, and why, are in its pause_requested event then
    parked = _why(data) if "owner" in data else None
    start, end = _PARKED_AT_WAIT
    if parked is not None and parked.startswith(start) and parked.endswith(end):
        # it parked on its way into a wait: that wait is in this event, not a blocked one
        f = replace(f, blocked={"reason": parked[len(start):-len(end)]})
    if "ffqn" in data:  # the submission's own event: submitted paused
        text = "submitted paused"
    elif parked is not None:
        asked = f.pause_requested
        text = f"paused by {_by(asked) or 'an operator'}"
        if (why := _why(asked)) is not None:
            text += f": {why}"
        text += f"; {parked.removeprefix(_REQUESTED)}"
    else:
        text = f"paused by {_by(data) or 'an operator'}"
        if isinstance(data.get("from"), str):
            text += f" while {data['from']}"
        if (why := _why(data)) is not None:
            text += f": {why}"
    if f.paused_from == str(Status.BLOCKED):
        text += f"; once unpaused, {_wait(f)}"
    return text
