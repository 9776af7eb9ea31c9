"""What to do with a running delegated execution: one pure function of one observation.

The reconciler, an operator's resolve and a cancel of a delegated run all ask the same
question about an execution that an external engine runs, and all answer it here. The
table at the heart of it (docs/external.md, "The reconciler"):

======  ========  ===============  ================================================
ext id  breached  engine           action
======  ========  ===============  ================================================
yes     no        finished         end locally (``failed_transient``), no stop
yes     yes       running          ask the engine to stop; end only once it
                                   confirms it finished (this look or a later one)
yes     yes       finished         end locally (``failed_transient``)
no      any       unknown          leave running; flag for an operator
======  ========  ===============  ================================================

and the rows the table leaves implicit, each leaning toward the safe error (a stale
``running`` is acceptable, a terminal state over a run that may still be going is not):

- id, no breach, engine running: nothing to do.
- id, engine answer unknown (unreachable, timeout, 5xx, a bad answer, the HTML 404 n8n
  serves while it starts): nothing, asked again next time. Only the engine's own "no such
  run" (n8n: a JSON 404) flags the execution, and that flag clears itself as soon as a
  later look finds the run.
- no id: nothing while the trigger may still be waiting for the engine's answer, a flag
  afterwards. Without an id the engine can be neither asked nor stopped.
- an engine that is not configured: flag (it can be neither asked nor stopped).

A *stop* is wanted when the limit is breached, when someone asked to cancel the execution,
or when an operator asked to end it (``resolve`` fail or cancel); it ends, once the engine
confirms the run finished, as ``cancelled`` for a cancel (the operator's or anyone's) and
``failed_transient`` otherwise. A stop the engine has not confirmed ``stop_flag_after``
after it was first wanted flags the execution for an operator, which stays running.

Nothing here ever produces ``completed``: only ``/complete`` carries the result. This
module does no I/O; :func:`classify_n8n` turns n8n's answer into an :class:`EngineState`
and :func:`limit_breached` measures a limit from Veracity's own trigger time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from veracity.core.states import Status

__all__ = [
    "DEFAULT_STOP_FLAG_AFTER",
    "N8N_ACTIVE_STATUSES",
    "N8N_TERMINAL_STATUSES",
    "SELF_CLEARING_FLAGS",
    "Action",
    "Decision",
    "EngineState",
    "FlagKind",
    "Observation",
    "OperatorEnd",
    "StopCause",
    "WriteKind",
    "classify_n8n",
    "decide",
    "limit_breached",
    "stop_cause",
]

DEFAULT_STOP_FLAG_AFTER = timedelta(minutes=10)


class EngineState(StrEnum):
    """What the engine says about a run, reduced to the one thing the table needs."""

    FINISHED = "finished"
    """The engine has certainly stopped running it (n8n: stoppedAt set AND terminal)."""

    RUNNING = "running"
    """The engine may still run it: active, queued, or parked in a Wait node."""

    UNKNOWN = "unknown"
    """No trustworthy answer: unreachable, timeout, 5xx, unparsable, 404, odd status, or
    the engine was not asked."""


class Action(StrEnum):
    """What to do with one execution after one look."""

    NOTHING = "nothing"
    """Leave it as it is (possibly clearing a flag: :attr:`Decision.clear_flag`)."""

    END = "end"
    """Record :attr:`Decision.to`; the engine has finished, so no remote stop."""

    STOP_REMOTE = "stop_remote"
    """Ask the engine to stop the run, then look again; stay ``running`` until it
    confirms the run finished."""

    FLAG = "flag"
    """Leave it running and flag it for an operator (:attr:`Decision.flag`)."""


class FlagKind(StrEnum):
    """Why an execution is on the operators' flagged list (``flag_kind``)."""

    NO_EXTERNAL_ID = "no_external_id"
    """No external id: whether the engine started the run is unknown."""

    TRIGGER_UNKNOWN = "trigger_unknown"
    """The trigger's outcome was ambiguous (timeout, 5xx, an answer without an id)."""

    ENGINE_UNCONFIGURED = "engine_unconfigured"
    """The execution's engine is not configured here: it can be neither asked nor stopped."""

    UNKNOWN_ID = "unknown_id"
    """The engine's API says it has no run with this id (n8n: a JSON 404)."""

    STOP_UNCONFIRMED = "stop_unconfirmed"
    """A stop was wanted (limit, cancel, operator) and the engine has not confirmed it."""

    FORCED = "forced"
    """Ended by an operator without the engine's confirmation (terminal; kept on the
    flagged list so the run is checked in the engine)."""


SELF_CLEARING_FLAGS: frozenset[FlagKind] = frozenset(
    {FlagKind.UNKNOWN_ID, FlagKind.ENGINE_UNCONFIGURED}
)
"""Flags raised because the engine could not find or be asked about the run: cleared as
soon as a later look finds the run."""

_NO_ID_FLAGS = frozenset({FlagKind.NO_EXTERNAL_ID, FlagKind.TRIGGER_UNKNOWN})


class WriteKind(StrEnum):
    """The writes a look can lead to (also the label of the reconciler's action metric)."""

    TERMINATE = "terminate"
    """End the execution (``failed_transient`` or ``cancelled``): the engine finished."""

    FLAG = "flag"
    """Flag it for an operator; it stays running."""

    UNFLAG = "unflag"
    """Clear a flag that no longer holds; it stays running."""


class OperatorEnd(StrEnum):
    """An operator's request to end a delegated run (``resolve`` fail or cancel)."""

    FAIL = "fail"
    CANCEL = "cancel"


class StopCause(StrEnum):
    """Why a stop is wanted, strongest first when several hold."""

    OPERATOR_FAIL = "operator_fail"
    OPERATOR_CANCEL = "operator_cancel"
    CANCEL = "cancel"
    LIMIT = "limit"

    @property
    def ends_as(self) -> Status:
        """The status the execution ends in once the engine confirms the run finished."""
        if self in (StopCause.OPERATOR_CANCEL, StopCause.CANCEL):
            return Status.CANCELLED
        return Status.FAILED_TRANSIENT

    @property
    def words(self) -> str:
        return {
            StopCause.OPERATOR_FAIL: "an operator asked to end it (fail)",
            StopCause.OPERATOR_CANCEL: "an operator asked to end it (cancel)",
            StopCause.CANCEL: "cancel requested",
            StopCause.LIMIT: "limit breached",
        }[self]


@dataclass(frozen=True, slots=True)
class Observation:
    """Everything one look at one running delegated execution knows.

    Times are timezone-aware; ``now`` is the store's clock.
    """

    now: datetime
    has_external_id: bool
    triggered_at: datetime | None = None
    """Veracity's own record of when it sent the trigger."""
    trigger_grace: timedelta = timedelta(0)
    """How long after its trigger a missing external id is not news yet (the engine's
    call timeout plus a margin)."""
    max_duration: timedelta | None = None
    engine_configured: bool = True
    engine: EngineState = EngineState.UNKNOWN
    unknown_id: bool = False
    """The engine's own API said this id is none of its runs (not a guess)."""
    cancel_requested_at: datetime | None = None
    operator_end: OperatorEnd | None = None
    operator_end_at: datetime | None = None
    stop_flag_after: timedelta = DEFAULT_STOP_FLAG_AFTER
    stop_sent: bool = False
    """This look follows a stop request sent just now: do not ask again before next time."""
    flag: FlagKind | None = None
    """The flag the execution carries now, if any."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The action for one execution, with a reason fit for its history and the logs."""

    action: Action
    reason: str
    to: Status | None = None
    """For :attr:`Action.END`: the terminal status."""
    flag: FlagKind | None = None
    """For :attr:`Action.FLAG`: why."""
    cause: StopCause | None = None
    """Why a stop is wanted, if it is."""
    clear_flag: bool = False
    """The execution's self-clearing flag no longer holds (the engine found the run)."""


def stop_cause(obs: Observation) -> tuple[StopCause, datetime] | None:
    """The strongest reason to stop the run, with the time it first held; None if none."""
    if obs.operator_end is not None:
        cause = (StopCause.OPERATOR_FAIL if obs.operator_end is OperatorEnd.FAIL
                 else StopCause.OPERATOR_CANCEL)
        return cause, obs.operator_end_at or obs.now
    if obs.cancel_requested_at is not None:
        return StopCause.CANCEL, obs.cancel_requested_at
    if obs.triggered_at is not None and obs.max_duration is not None and limit_breached(
        obs.triggered_at, obs.max_duration, obs.now
    ):
        return StopCause.LIMIT, obs.triggered_at + obs.max_duration
    return None


def _flag(obs: Observation, kind: FlagKind, reason: str,
          cause: StopCause | None = None) -> Decision:
    if obs.flag is kind:
        return Decision(Action.NOTHING, f"already flagged: {reason}", cause=cause)
    return Decision(Action.FLAG, reason, flag=kind, cause=cause)


def decide(obs: Observation) -> Decision:
    """The decision for one look (module docstring). Pure: same observation, same answer."""
    wanted = stop_cause(obs)
    cause = wanted[0] if wanted else None
    if not obs.has_external_id:
        if obs.triggered_at is not None and obs.now < obs.triggered_at + obs.trigger_grace:
            return Decision(Action.NOTHING, "the trigger may still be waiting for the "
                            "engine's answer: no external id is not news yet", cause=cause)
        if obs.flag in _NO_ID_FLAGS:  # the first, more specific reason stays
            return Decision(Action.NOTHING, "already flagged: no external id", cause=cause)
        return _flag(obs, FlagKind.NO_EXTERNAL_ID,
                     "no external id: whether the engine started the run is unknown; attach "
                     "its id or end the run", cause)
    if not obs.engine_configured:
        return _flag(obs, FlagKind.ENGINE_UNCONFIGURED,
                     "its engine is not configured here: the run can be neither verified "
                     "nor stopped", cause)
    found = obs.engine is not EngineState.UNKNOWN
    clear = found and (obs.flag in SELF_CLEARING_FLAGS
                       or (obs.flag is FlagKind.STOP_UNCONFIRMED and cause is None))
    if obs.engine is EngineState.FINISHED:
        if cause is None:
            return Decision(Action.END, "the engine run finished but no callback reported "
                            "its outcome", to=Status.FAILED_TRANSIENT)
        return Decision(Action.END, f"{cause.words}; the engine run has finished",
                        to=cause.ends_as, cause=cause)
    overdue = wanted is not None and obs.now - wanted[1] >= obs.stop_flag_after
    if obs.engine is EngineState.UNKNOWN:
        if obs.unknown_id:
            return _flag(obs, FlagKind.UNKNOWN_ID, "the engine says it has no run with this "
                         "id; left running (cleared if a later look finds it)", cause)
        if cause is not None and overdue:
            return _flag(obs, FlagKind.STOP_UNCONFIRMED,
                         f"{cause.words}; the engine did not confirm the stop", cause)
        return Decision(Action.NOTHING, "engine answer unknown: left running, asked again "
                        "next time", cause=cause)
    # the engine runs it
    if cause is None:
        return Decision(Action.NOTHING, "running within its limit", clear_flag=clear)
    if not obs.stop_sent:
        return Decision(Action.STOP_REMOTE, f"{cause.words} while the engine still runs it: "
                        "stop requested, terminal once the engine confirms it finished",
                        cause=cause, clear_flag=clear)
    if overdue:
        decision = _flag(obs, FlagKind.STOP_UNCONFIRMED,
                         f"{cause.words}; the engine did not confirm the stop", cause)
        return decision
    return Decision(Action.NOTHING, f"{cause.words}; stop requested, the engine has not "
                    "confirmed it yet: asked again next time", cause=cause, clear_flag=clear)


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
