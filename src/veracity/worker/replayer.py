"""The replayer: one execution's history replayed against the current code of its
workflow, from the history alone (docs/workflows.md, "Checking a code change against
production histories").

The workflow function runs with a :class:`Context` that has no store: each recorded call
returns its recorded outcome and is compared with the record, exactly as a worker's replay
does, and the first call that goes beyond the history stops the replay before anything is
run, written, started or waited for. Nothing touches a database. The outcome is a
:class:`ReplayResult`: the first divergence, or that the code is consistent with the
history (to its end, or as far as the history goes).

Used by ``veracity.testing.replay`` (in a user's own tests) and ``veracity replay ID``.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from veracity.app import App
from veracity.core.params import shapes_of_functions
from veracity.errors import InvalidInput
from veracity.models import JSON, HistoryEvent
from veracity.worker.context import Context
from veracity.worker.errors import HistoryEnd
from veracity.worker.journal import Journal, retries_made

SUBMITTED_KINDS = ("pending", "paused")
"""The kinds of an execution's first event, which records its workflow and parameters."""
DELEGATION_KINDS = ("trigger_sending", "external_started")
"""Events that only a run delegated to an external engine has (docs/external.md)."""


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What replaying one history against the current code found."""

    execution_id: uuid.UUID
    ffqn: str
    consistent: bool
    """False at the first divergence: a call that differs from the recorded one, or a
    workflow that finished while its history holds calls it did not make."""
    position: int | None
    """Where the replay stopped: the position of the first divergence or, when the
    history ends before the run does, of the first call it does not hold (or whose outcome
    it does not hold yet). None when the workflow ran to its end consistently."""
    message: str
    replayed: int
    """Recorded calls the replay made and compared with their record."""
    finished: bool
    """The workflow function ran to its end (returned, or raised its own error)."""
    recorded: str | None = None
    """At a divergence: the recorded call (or the calls the finished run never made)."""
    new: str | None = None
    """At a divergence: the call the code makes now. When the history ends before the run
    does: the call at ``position``."""
    waiting: bool = False
    """The history ends while the execution waits on the call at ``position`` (a sleep not
    over, a receive with no message yet): that call was replayed, its outcome is new."""

    def to_json(self) -> dict[str, JSON]:
        return {
            "execution_id": str(self.execution_id),
            "ffqn": self.ffqn,
            "consistent": self.consistent,
            "position": self.position,
            "message": self.message,
            "replayed": self.replayed,
            "finished": self.finished,
            "recorded": self.recorded,
            "new": self.new,
            "waiting": self.waiting,
        }


def replay(app: App, history: Any, *, execution_id: uuid.UUID | str | None = None
           ) -> ReplayResult:
    """Replay one execution's ``history`` against ``app``'s current code of its workflow.

    ``history``: the execution's events, oldest first, from its first one: a list of
    :class:`~veracity.models.HistoryEvent` (``store.history_list``), or the API's JSON
    items (``GET /v1/executions/{id}/history``, ``veracity history ID --json``: the list or
    the whole page). The API's items do not carry the execution's id: pass
    ``execution_id`` with them (workflow code may use ``ctx.execution_id``).

    Returns a :class:`ReplayResult`; a history that cannot be replayed (malformed, not
    one execution's from its start, of a workflow ``app`` does not register, of a run
    delegated to an external engine) raises :class:`~veracity.errors.InvalidInput`.
    Usable from synchronous code and from a running event loop (it then replays on a
    thread of its own); in async code, ``await replay_async(...)`` is the same.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(replay_async(app, history, execution_id=execution_id))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="veracity-replay") as pool:
        return pool.submit(
            asyncio.run, replay_async(app, history, execution_id=execution_id)).result()


async def replay_async(app: App, history: Any, *,
                       execution_id: uuid.UUID | str | None = None) -> ReplayResult:
    """:func:`replay`, as a coroutine."""
    events = history_events(history, execution_id)
    ident = events[0].execution_id
    ffqn, params, deployment_id = _submission(events)
    for ev in events:
        if ev.kind in DELEGATION_KINDS:
            engine = ev.data.get("engine") if isinstance(ev.data, Mapping) else None
            by = f" ({engine})" if engine else ""
            raise InvalidInput(
                f"execution {ident} ({ffqn}) is a run delegated to an external engine{by} "
                f"(its event {ev.kind} at seq {ev.seq}): its history records no workflow "
                "calls; replay applies to Veracity's own workflows", code="not_replayable")
    wf = app.get(ffqn)
    if wf is None:
        raise InvalidInput(
            f"execution {ident} runs workflow {ffqn!r}, which the app does not register "
            f"(it registers: {', '.join(app) or 'none'})", code="unknown_workflow")
    ctx = Context(
        store=None,
        claim=None,
        execution_id=ident,
        deployment_id=deployment_id,
        attempt=_last_attempt(events),
        journal=Journal.from_history(events),  # the current try's, after a workflow retry
        clock_base=events[-1].at,  # a sleep over by the last event is over; later, not
        retry=retries_made(events),
        # a call beyond the history is checked as the worker checks it: a run that caught
        # InvalidParams and went on replays the same way (docs/workflows.md)
        shapes=shapes_of_functions({f: w.fn for f, w in app.workflows.items()}),
    )
    ended: str | None = None  # how the function ended, if it ran to its end
    try:
        await wf.fn(ctx, *params)
        ended = "it returned"
    except HistoryEnd:
        pass  # kept on the context (also when workflow code caught it)
    except Exception as exc:
        if exc is not ctx.nondeterminism:  # the workflow's own error ends its run too
            ended = f"it raised {type(exc).__name__}: {exc}"
    return _result(ctx, ident, ffqn, ended)


def _result(ctx: Context, ident: uuid.UUID, ffqn: str, ended: str | None) -> ReplayResult:
    n = ctx.calls_replayed
    err = ctx.nondeterminism  # the first divergence, even if workflow code caught it
    end = ctx.history_end
    if err is None and end is None:
        err = ctx.finish()  # recorded calls the finished run never made
    if err is not None:
        return ReplayResult(ident, ffqn, False, err.position, str(err), n,
                            finished=ended is not None, recorded=err.recorded, new=err.new)
    if end is not None:
        calls = f"replayed {n} recorded call{'' if n == 1 else 's'}"
        if end.waiting:
            told = (f"{calls}; the history ends while the execution waits in {end.call} "
                    f"at position {end.position} (recorded, not over yet): what follows "
                    "is new")
        else:
            told = (f"{calls}; the history ends there: the workflow's next call, "
                    f"{end.call} at position {end.position}, and what follows are new")
        return ReplayResult(ident, ffqn, True, end.position, f"consistent so far: {told}", n,
                            finished=False, new=end.call, waiting=end.waiting)
    return ReplayResult(
        ident, ffqn, True, None,
        f"consistent: the workflow ran to its end ({ended}) making exactly the {n} "
        f"call{'' if n == 1 else 's'} its history records", n, finished=True)


# -- the history given ---------------------------------------------------------------------


def history_events(history: Any, execution_id: uuid.UUID | str | None = None
                   ) -> list[HistoryEvent]:
    """``history`` as HistoryEvents of one execution, checked to start at its first event
    and to be in order. Accepts HistoryEvents, the API's JSON items, or the API's page."""
    ident = _parse_id(execution_id) if execution_id is not None else None
    if isinstance(history, Mapping):
        if "items" not in history:
            raise InvalidInput("a history is a list of events, or a page with 'items'",
                               code="invalid_history")
        if history.get("next_cursor"):
            raise InvalidInput("this history page is not the whole history (it has a "
                               "next_cursor): give all of its events", code="invalid_history")
        history = history["items"]
    if isinstance(history, str | bytes) or not isinstance(history, Sequence):
        raise InvalidInput("a history is a list of events", code="invalid_history")
    if not history:
        raise InvalidInput("the history is empty", code="invalid_history")
    events = [_event(item, i, ident) for i, item in enumerate(history)]
    ids = {ev.execution_id for ev in events}
    if len(ids) > 1:
        raise InvalidInput(f"the history mixes the events of {len(ids)} executions",
                           code="invalid_history")
    for before, after in itertools.pairwise(events):
        if after.seq <= before.seq:
            raise InvalidInput(f"the history is not in order: seq {after.seq} comes after "
                               f"seq {before.seq}", code="invalid_history")
    if events[0].seq != 1:
        raise InvalidInput(f"the history starts at seq {events[0].seq}: give it from its "
                           "first event (seq 1)", code="invalid_history")
    return events


def _parse_id(value: uuid.UUID | str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise InvalidInput(f"{str(value)[:80]!r} is not an execution id (a UUID)",
                           code="invalid_id") from None


def _event(item: Any, index: int, ident: uuid.UUID | None) -> HistoryEvent:
    if isinstance(item, HistoryEvent):
        if ident is not None and item.execution_id != ident:
            raise InvalidInput(f"the history is of execution {item.execution_id}, not "
                               f"{ident}", code="invalid_history")
        return item
    if not isinstance(item, Mapping):
        raise InvalidInput(f"history item {index} is a {type(item).__name__}, not an event",
                           code="invalid_history")
    missing = [k for k in ("seq", "kind", "at", "data") if k not in item]
    if missing:
        raise InvalidInput(f"history item {index} lacks {', '.join(missing)}",
                           code="invalid_history")
    seq, kind, at = item["seq"], item["kind"], item["at"]
    if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(kind, str):
        raise InvalidInput(f"history item {index}: seq must be an integer and kind a string",
                           code="invalid_history")
    if isinstance(at, str):
        try:
            at = datetime.fromisoformat(at.replace("Z", "+00:00"))
        except ValueError:
            at = None
    if not isinstance(at, datetime) or at.tzinfo is None:
        raise InvalidInput(f"history item {index}: at must be an ISO 8601 time with its "
                           "timezone", code="invalid_history")
    own = item.get("execution_id")
    if own is not None:
        parsed = _parse_id(own)
        if ident is not None and parsed != ident:
            raise InvalidInput(f"the history is of execution {parsed}, not {ident}",
                               code="invalid_history")
        ident = parsed
    if ident is None:
        raise InvalidInput("the history's items do not name their execution (the API's do "
                           "not): give its id (execution_id=...)", code="invalid_history")
    return HistoryEvent(ident, seq, kind, at, item["data"])


def _submission(events: list[HistoryEvent]) -> tuple[str, list[Any], str]:
    """The workflow, parameters and deployment, from the execution's first event."""
    first = events[0]
    data = first.data
    if (first.kind not in SUBMITTED_KINDS or not isinstance(data, Mapping)
            or not isinstance(data.get("ffqn"), str)
            or not isinstance(data.get("params"), list)):
        raise InvalidInput(f"the history's first event ({first.kind}) is not an execution's "
                           "submission (pending or paused, with its ffqn and params)",
                           code="invalid_history")
    return data["ffqn"], list(data["params"]), str(data.get("deployment_id") or "")


def _last_attempt(events: list[HistoryEvent]) -> int:
    """The attempt of the history's last run (1 before any)."""
    for ev in reversed(events):
        if ev.kind == "running" and isinstance(ev.data, Mapping):
            attempt = ev.data.get("attempt")
            if isinstance(attempt, int):
                return attempt
    return 1
