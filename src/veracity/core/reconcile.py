"""The external-execution reconciler's decision: a pure function of three answers.

For each running execution delegated to an external engine, the reconciler asks three
questions — does it have an external execution id, has it breached its limit, has the
engine finished? — and acts on the answers exactly as seed 000's table says:

======  ========  ===============  ================================================
ext id  breached  engine           action
======  ========  ===============  ================================================
yes     no        finished         terminate locally (``failed_transient``), no stop
yes     yes       running          ask the engine to stop; terminal only once it
                                   confirms it finished (this tick or a later one)
yes     yes       finished         terminate locally (``failed_transient``)
no      any       unknown          leave running; flag for an operator
======  ========  ===============  ================================================

and, for the combinations the seed leaves implicit:

- id, no breach, engine running: nothing to do (the run is within its limit).
- id, any breach, engine answer unknown (unreachable, timeout, 5xx, bad answer, 404):
  nothing to do — never terminal on a guess. (A 404 also flags the execution; that is
  the caller's business, driven by the adapter's ``not_found``.)
- no id, whatever the other answers: flag. Without an id the engine can be neither asked
  nor stopped, so nothing it might say can authorise a terminal state.

Every decision leans toward the safe error (the truthfulness invariant): a stale
``running`` is acceptable, a terminal state over a run that may still be going is not.
The reconciler never produces ``completed``: only ``/complete`` carries the result.

This module does no I/O; :func:`classify_n8n` turns n8n's answer into an
:class:`EngineState` and :func:`limit_breached` measures a limit from Veracity's own
trigger time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

__all__ = [
    "N8N_ACTIVE_STATUSES",
    "N8N_TERMINAL_STATUSES",
    "Action",
    "Decision",
    "EngineState",
    "classify_n8n",
    "decide",
    "limit_breached",
]


class EngineState(StrEnum):
    """What the engine says about a run, reduced to the one thing the table needs."""

    FINISHED = "finished"
    """The engine has certainly stopped running it (n8n: stoppedAt set AND terminal)."""

    RUNNING = "running"
    """The engine may still run it: active, queued, or parked in a Wait node."""

    UNKNOWN = "unknown"
    """No trustworthy answer: unreachable, timeout, 5xx, unparsable, 404, odd status."""


class Action(StrEnum):
    """What the reconciler does with one execution on this tick."""

    NOTHING = "nothing"
    """Leave it as it is."""

    TERMINATE_LOCAL = "terminate_local"
    """Record ``failed_transient``; the engine has finished, so no remote stop."""

    STOP_REMOTE = "stop_remote"
    """Ask the engine to stop the run; stay ``running`` until it confirms it finished."""

    FLAG = "flag"
    """Leave it running and flag it for an operator."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The action for one execution, with a reason fit for its history and the logs."""

    action: Action
    reason: str


def decide(has_external_id: bool, limit_breached: bool, engine: EngineState) -> Decision:
    """Seed 000's decision table, completed with its implicit rows (module docstring).

    ``engine`` is ignored without an external id: the engine cannot have been asked.
    """
    if not has_external_id:
        return Decision(
            Action.FLAG,
            "no external execution id: the engine run can be neither verified nor stopped; "
            "left running for an operator",
        )
    if engine is EngineState.UNKNOWN:
        return Decision(
            Action.NOTHING, "engine answer unknown: left running, asked again next tick"
        )
    if engine is EngineState.FINISHED:
        if limit_breached:
            return Decision(
                Action.TERMINATE_LOCAL, "limit breached and the engine run has finished"
            )
        return Decision(
            Action.TERMINATE_LOCAL,
            "the engine run finished but no callback reported its outcome",
        )
    if limit_breached:
        return Decision(
            Action.STOP_REMOTE,
            "limit breached while the engine still runs it: stop requested, terminal once "
            "the engine confirms it finished",
        )
    return Decision(Action.NOTHING, "running within its limit")


# n8n's ExecutionStatus values. "finished" in n8n's answer is true only for success and
# is deliberately not used.
N8N_TERMINAL_STATUSES: frozenset[str] = frozenset({"success", "error", "canceled", "crashed"})
"""Statuses after which n8n no longer runs the execution (given stoppedAt is set)."""

N8N_ACTIVE_STATUSES: frozenset[str] = frozenset({"new", "running", "waiting"})
"""Statuses of a run n8n may still execute: queued, running, or parked in a Wait node."""


def classify_n8n(status: str | None, stopped_at: str | None) -> EngineState:
    """Reduce n8n's ``status`` and ``stoppedAt`` to an :class:`EngineState`.

    Finished needs both: ``stoppedAt`` set AND a terminal status. n8n sets ``stoppedAt``
    on a run parked in a Wait node (status ``waiting``), and a run just resumed reads
    ``running`` with the old ``stoppedAt`` still set for a few seconds; both are running.
    A terminal status without ``stoppedAt`` contradicts itself and is unknown, as are
    ``unknown``, an absent status and any status this code does not know.
    """
    if status in N8N_ACTIVE_STATUSES:
        return EngineState.RUNNING
    if status in N8N_TERMINAL_STATUSES:
        return EngineState.FINISHED if stopped_at else EngineState.UNKNOWN
    return EngineState.UNKNOWN


def limit_breached(
    triggered_at: datetime, max_duration: timedelta | float | None, now: datetime
) -> bool:
    """Has a run triggered at ``triggered_at`` outlived ``max_duration`` by ``now``?

    Measured from Veracity's own record of when it sent the trigger, never from the
    engine's ``startedAt`` (n8n rewrites that when a waiting run resumes). A number is
    seconds; ``None`` means no limit. A run is breached strictly after the limit.
    Both times must be timezone-aware.
    """
    if triggered_at.tzinfo is None or now.tzinfo is None:
        raise ValueError("limit_breached needs timezone-aware datetimes")
    if max_duration is None:
        return False
    if isinstance(max_duration, timedelta):
        limit = max_duration
    else:
        seconds = float(max_duration)
        if not math.isfinite(seconds):
            raise ValueError("max_duration must be a finite number of seconds")
        limit = timedelta(seconds=seconds)
    if limit < timedelta(0):
        raise ValueError("max_duration cannot be negative")
    return now - triggered_at > limit
