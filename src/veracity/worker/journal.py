"""The journal: the calls an execution's earlier runs recorded in its history, by position,
and how a replayed call is compared with the record (docs/workflows.md, "Time and other
sources of nondeterminism", lists what is compared).

Nothing here does I/O: the context (:mod:`veracity.worker.context`) reads a recorded call
here and decides, from the comparison, whether the replay goes on or diverges.
"""

from __future__ import annotations

import functools
import hashlib
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from veracity.core.retry import WORKFLOW_RETRY
from veracity.core.states import Status
from veracity.models import JSON, HistoryEvent

STEP_COMPLETED = "step_completed"
STEP_FAILED = "step_failed"
NOW_RECORDED = "now_recorded"
SLEEP_STARTED = "sleep_started"
CHILD_SUBMITTED = "child_submitted"
SCHEDULED = "scheduled"
JOIN_NEXT = "join_next"
RECV_STARTED = "recv_started"
MESSAGE_RECEIVED = "message_received"
RECV_TIMED_OUT = "recv_timed_out"
JOURNAL_KINDS = frozenset({
    STEP_COMPLETED, STEP_FAILED, NOW_RECORDED, SLEEP_STARTED, CHILD_SUBMITTED, SCHEDULED,
    JOIN_NEXT, RECV_STARTED, MESSAGE_RECEIVED, RECV_TIMED_OUT,
})
"""The kinds of history event that record a call (each with its ``pos``). The others
(state changes, messages arriving, cancel and pause requests, late reports...) record what
happened to the execution, not a call its workflow made."""

Mismatch = tuple[str, str]
"""A replayed call that is not the recorded one: (the recorded call, the new call)."""


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """How a child execution ended, as ``JoinSet.next()`` returns it."""

    execution_id: uuid.UUID
    ffqn: str
    status: Status
    result: JSON
    error: JSON

    @property
    def ok(self) -> bool:
        return self.status == Status.COMPLETED


def outcome_of(data: Mapping[str, Any]) -> ChildOutcome:
    """A child's outcome, from its ``join_next`` record."""
    return ChildOutcome(
        execution_id=uuid.UUID(str(data["child_id"])),
        ffqn=str(data.get("ffqn")),
        status=Status(str(data["status"])),
        result=data.get("result"),
        error=data.get("error"),
    )


def step_name(fn: Callable[..., Any]) -> str:
    """A name that is the same in every process: never an address or a repr."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    qualname = getattr(fn, "__qualname__", None)
    if qualname is None:  # a callable object: name its class
        cls = type(fn)
        return f"{cls.__module__}.{cls.__qualname__}"
    return f"{getattr(fn, '__module__', None) or '?'}.{qualname}"


def args_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """A step's arguments, fingerprinted to tell on replay whether they changed; None when
    they are not JSON (an object's repr may differ from run to run: not compared then)."""
    try:
        text = json.dumps([list(args), kwargs], sort_keys=True, allow_nan=False,
                          separators=(",", ":"))
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def retry_start(events: list[HistoryEvent]) -> int:
    """The index of the first event of the current try (after the last workflow retry)."""
    for i in range(len(events) - 1, -1, -1):
        ev = events[i]
        if (ev.kind == "pending" and isinstance(ev.data, Mapping)
                and ev.data.get("reason") == WORKFLOW_RETRY):
            return i + 1
    return 0


def retries_made(events: list[HistoryEvent]) -> int:
    """How many times the workflow was retried after its own error."""
    return sum(1 for ev in events if ev.kind == "pending" and isinstance(ev.data, Mapping)
               and ev.data.get("reason") == WORKFLOW_RETRY)


FORK_STOPS = frozenset({STEP_FAILED, CHILD_SUBMITTED, SCHEDULED, JOIN_NEXT})
"""Where an operator's retry stops replaying a failed run: the failure itself (the step is
tried again), and children and schedules (they belong to the failed execution)."""


def retry_replay(events: list[HistoryEvent]) -> list[tuple[str, JSON]]:
    """The journal events of a failed run that its retry replays (as ``(kind, data)``):
    those of its last try, in order, up to the first failed step, child or schedule."""
    out: list[tuple[str, JSON]] = []
    stop_at: int | None = None
    for ev in events[retry_start(events):]:
        if ev.kind not in JOURNAL_KINDS or not isinstance(ev.data, Mapping):
            continue
        pos = ev.data.get("pos")
        if not isinstance(pos, int):
            continue
        if ev.kind in FORK_STOPS:
            stop_at = pos if stop_at is None else min(stop_at, pos)
        if stop_at is not None and pos >= stop_at:
            continue
        out.append((ev.kind, dict(ev.data)))
    return out


@dataclass
class Journal:
    """The recorded outcomes of an execution's earlier runs, by position."""

    entries: dict[int, HistoryEvent] = field(default_factory=dict)
    """The first journal event at each position."""
    by_pos: dict[int, list[HistoryEvent]] = field(default_factory=dict)
    """Every journal event at each position (a receive records its start, then its
    message or its timeout)."""

    @classmethod
    def from_history(cls, events: list[HistoryEvent]) -> Journal:
        """The journal of the current try: a workflow retry starts afresh, so the events
        before its last retry are not part of it."""
        entries: dict[int, HistoryEvent] = {}
        by_pos: dict[int, list[HistoryEvent]] = {}
        for ev in events[retry_start(events):]:
            if ev.kind in JOURNAL_KINDS and isinstance(ev.data, Mapping):
                pos = ev.data.get("pos")
                if isinstance(pos, int):
                    entries.setdefault(pos, ev)
                    by_pos.setdefault(pos, []).append(ev)
        return cls(entries, by_pos)

    def at(self, pos: int) -> list[HistoryEvent]:
        return self.by_pos.get(pos, [])

    def find(self, pos: int, kind: str) -> HistoryEvent | None:
        for ev in self.at(pos):
            if ev.kind == kind:
                return ev
        return None

    def unreached(self, end: int) -> list[tuple[int, str]]:
        """The recorded calls at ``end`` and after (position, call), in order: those a run
        that made only ``end`` calls never reached."""
        if not self.entries or max(self.entries) < end:
            return []  # the common case: every recorded call was reached
        return [(pos, describe(self.entries[pos])) for pos in sorted(self.entries)
                if pos >= end]


def describe(ev: HistoryEvent) -> str:
    """A journal event as a call, for nondeterminism messages."""
    data = ev.data
    if ev.kind in (STEP_COMPLETED, STEP_FAILED):
        return f"step {data.get('name')}"
    if ev.kind == SLEEP_STARTED:
        return describe_sleep(data.get("seconds"), data.get("when"))
    if ev.kind in (CHILD_SUBMITTED, SCHEDULED):
        verb = "submit" if ev.kind == CHILD_SUBMITTED else "schedule"
        return describe_spawn(verb, str(data.get("ffqn")), data.get("params"))
    if ev.kind == JOIN_NEXT:
        return f"next() of join set {data.get('join_set')}"
    if ev.kind in (RECV_STARTED, MESSAGE_RECEIVED, RECV_TIMED_OUT):
        return f"recv({data.get('topic')!r})"
    if ev.kind == NOW_RECORDED:
        return "now()"
    return ev.kind


def describe_sleep(seconds: Any, when: Any) -> str:
    if seconds is not None:
        return f"sleep({seconds:g}s)" if isinstance(seconds, int | float) else "sleep"
    if when is not None:
        return f"sleep_until({when})"
    return "sleep"


def describe_spawn(verb: str, ffqn: str, params: Any) -> str:
    if params is None:
        return f"{verb} {ffqn}"
    shown = json.dumps(params, separators=(",", ":"))
    return f"{verb} {ffqn}({shown[1:-1] if len(shown) <= 80 else shown[1:77] + '...'})"


# -- comparing a replayed call with the record ---------------------------------------------


def compare_step(recorded: HistoryEvent, label: str, digest: str | None) -> Mismatch | None:
    """A recorded step is the same call: same name and, when both are JSON, the same
    arguments (by their digest)."""
    data = recorded.data
    recorded_name = str(data.get("name"))
    if recorded_name != label:
        return f"step {recorded_name}", f"step {label}"
    was = data.get("args")
    if was is not None and digest is not None and was != digest:
        return (f"step {label} with arguments {was}",
                f"step {label} with other arguments ({digest})")
    return None


def same_sleep(data: Mapping[str, Any], seconds: float | None, when: datetime | None) -> bool:
    """Whether a recorded sleep asked for what this one asks (histories written before the
    request was recorded are taken as the same)."""
    if "seconds" in data or "when" in data:
        if seconds is not None:
            return data.get("seconds") == seconds
        recorded = data.get("when")
        return recorded is not None and when is not None and (
            datetime.fromisoformat(str(recorded)) == when)
    return True


def compare_sleep(recorded: HistoryEvent, seconds: float | None, when: datetime | None,
                  call: str) -> Mismatch | None:
    if not same_sleep(recorded.data, seconds, when):
        return describe(recorded), call
    return None


def compare_spawn(recorded: HistoryEvent, ffqn: str, params: JSON, call: str
                  ) -> Mismatch | None:
    """A recorded child or schedule is the same call: same name, same parameters."""
    data = recorded.data
    if data.get("ffqn") != ffqn or ("params" in data and data["params"] != params):
        return describe(recorded), call
    return None


def compare_recv(recorded: HistoryEvent, topic: str, call: str) -> Mismatch | None:
    """A recorded receive is the same call: on the same topic."""
    if recorded.data.get("topic") != topic:
        return describe(recorded), call
    return None
