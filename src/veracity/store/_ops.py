"""Multi-statement store operations, written once for every backend.

Each operation is a generator that yields :class:`Query` objects (a named query from the
backend's ``queries.sql`` and its parameters) and receives the rows, normalised to Python
values (UUIDs, aware datetimes, parsed JSON). A backend drives it inside one transaction:
PostgreSQL with ``async with conn.transaction()``, SQLite inside ``BEGIN IMMEDIATE`` on its
thread. The rules live here once; the SQL stays in the ``.sql`` files.

Every operation that changes an execution's status takes the row lock first (PostgreSQL
``FOR UPDATE``; SQLite's write lock), checks the state it may leave against the transition
table, and writes its history events with the seqs that follow the row's ``history_seq``.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from veracity.core.deployments import Coverage, LiveWorker, is_live
from veracity.core.ffqn import CANCELLABLE_SUFFIX
from veracity.core.reconcile import FlagKind, OperatorEnd, WriteKind
from veracity.core.recovery import Expired, decide_recovery
from veracity.core.requests import CallbackOutcome, CallbackReport, InterruptKind, ResolveAction
from veracity.core.retention import (
    Family,
    Member,
    PruneDecision,
    decide_prune,
    families_from,
    leaves_order,
    within,
)
from veracity.core.states import TERMINAL, Status, sources_of
from veracity.core.waiting import parked_reason
from veracity.models import (
    JSON,
    Adopted,
    BatchConflict,
    CallbackResult,
    Claim,
    ControlResult,
    CronDefinition,
    CronFire,
    CronRecord,
    DeploymentRecord,
    DeploymentSummary,
    Execution,
    HistoryEvent,
    Interrupt,
    Message,
    NewExecution,
    PruneBatch,
    ReconcileAction,
    Recovered,
    Submitted,
    Taken,
    TransitionResult,
    WaitRecord,
)
from veracity.store._common import check_journal_kind, late_report_event

Row = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class JsonParam:
    """A parameter the backend must send as JSON. Datetimes inside it are encoded the way
    the backend stores times (PostgreSQL: ISO 8601 text; SQLite: microseconds)."""

    value: JSON


@dataclass(frozen=True, slots=True)
class Query:
    name: str
    params: dict[str, Any]


Op = Generator[Query, list[Row], Any]

TERMINAL_NAMES = [str(s) for s in TERMINAL]
NO_ID_FLAGS = frozenset({str(FlagKind.NO_EXTERNAL_ID), str(FlagKind.TRIGGER_UNKNOWN)})


_EXECUTION_SLOTS: tuple[tuple[str, Callable[[Execution, Any], None]], ...] = tuple(
    (name, vars(Execution)[name].__set__)
    for name in Execution.__dataclass_fields__ if name != "status")
_SET_STATUS: Callable[[Execution, Status], None] = vars(Execution)["status"].__set__
_STATUSES = {str(s): s for s in Status}


def execution_from(row: Row) -> Execution:
    """The execution a row of ``veracity_executions`` holds (every column read).

    Built without ``Execution.__init__``, by setting its slots: a frozen dataclass's
    ``__init__`` sets each of its 34 fields through ``object.__setattr__``, about 8 µs a
    row, and a worker reads two rows per execution (its claim and its completion). The
    object is the same (tests/store/test_rows.py); a status that is not one is still a
    ``ValueError``."""
    execution: Execution = object.__new__(Execution)
    for name, put in _EXECUTION_SLOTS:
        put(execution, row[name])
    status = row["status"]
    _SET_STATUS(execution, _STATUSES.get(status) or Status(status))
    return execution


@functools.lru_cache(maxsize=64)
def execution_maker(columns: tuple[str, ...]) -> Callable[[Sequence[Any]], Execution]:
    """What :func:`execution_from` builds, from a row of values in the order of
    ``columns`` (a statement's result columns; others than the execution's are ignored).

    For a driver that gives rows as tuples: the execution is built straight from the
    tuple, without the mapping of column names to values each row would otherwise be
    turned into first (some 2 µs of a worker's CPU per row, two rows per execution). A
    column the execution needs that ``columns`` lacks is a ``KeyError`` at once."""
    index = {name: i for i, name in enumerate(columns)}
    puts = tuple((index[name], put) for name, put in _EXECUTION_SLOTS)
    status_at = index["status"]

    def make(values: Sequence[Any]) -> Execution:
        execution: Execution = object.__new__(Execution)
        for i, put in puts:
            put(execution, values[i])
        status = values[status_at]
        _SET_STATUS(execution, _STATUSES.get(status) or Status(status))
        return execution

    return make


def event_from(row: Row) -> HistoryEvent:
    return HistoryEvent(execution_id=row["execution_id"], seq=row["seq"], kind=row["kind"],
                        at=row["at"], data=row["data"])


def message_from(row: Row) -> Message:
    return Message(
        id=row["message_id"],
        execution_id=row["execution_id"],
        topic=row["topic"],
        payload=row["payload"],
        created_at=row["created_at"],
        consumed_at=row["consumed_at"],
        consumed_pos=row["consumed_pos"],
    )


def _names(states: Sequence[Status]) -> list[str]:
    return [str(s) for s in states]


# -- building blocks ------------------------------------------------------------------------


def _one(rows: list[Row]) -> Row | None:
    return rows[0] if rows else None


def _events(execution_id: uuid.UUID, after_seq: int, events: Sequence[tuple[str, JSON]],
            now: datetime | None) -> Op:
    """Append events with the seqs following ``after_seq``."""
    for i, (kind, data) in enumerate(events, 1):
        yield Query("history_append", {
            "execution_id": execution_id, "seq": after_seq + i, "kind": kind,
            "data": JsonParam(data), "now": now,
        })


def _lock(execution_id: uuid.UUID) -> Op:
    rows = yield Query("execution_lock", {"id": execution_id})
    return _one(rows)


def _fenced(claim: Claim, now: datetime | None) -> Op:
    """Lock the execution if ``claim`` still holds its lease, else None."""
    rows = yield Query("execution_lock_owned", {
        "id": claim.execution_id, "owner": claim.owner, "epoch": claim.epoch, "now": now,
    })
    return _one(rows)


def _late(claim: Claim, report: str, payload: JSON, now: datetime | None) -> Op:
    row = yield from _lock(claim.execution_id)
    if row is None:
        return TransitionResult(False, None, "execution does not exist")
    current = execution_from(row)
    late = late_report_event(report, claim, payload, current)
    rows = yield Query("execution_bump_history", {"id": claim.execution_id, "by": 1})
    yield from _events(claim.execution_id, current.history_seq, [("late_report", late)], now)
    return TransitionResult(False, execution_from(rows[0]), str(late["reason"]))


def _get(execution_id: uuid.UUID) -> Op:
    rows = yield Query("execution_get", {"id": execution_id})
    row = _one(rows)
    return execution_from(row) if row else None


# -- worker-side operations (fenced) -------------------------------------------------------


def block_if_owned(
    claim: Claim,
    *,
    wake_at: datetime | None,
    seen_signal: int,
    events: Sequence[tuple[str, JSON]],
    reason: str,
    now: datetime | None,
) -> Op:
    """running -> blocked (holding no lease), with the journal events that explain the wait.

    It goes to pending instead when what it waits for already happened: a signal moved
    since ``seen_signal`` was read, or the timer is already due. A cancel or pause that was
    requested meanwhile is acted on here, at this wait: cancelled (or blocked on the
    children it may not cancel), or paused with the wait kept.
    """
    for kind, _ in events:
        check_journal_kind(kind)
    row = yield from _fenced(claim, now)
    if row is None:
        return (yield from _late(claim, "block", {"reason": reason}, now))
    seq = row["history_seq"]
    yield from _events(claim.execution_id, seq, events, now)
    if row["cancel_requested_at"] is not None:
        yield Query("execution_bump_history", {"id": claim.execution_id, "by": len(events)})
        return (yield from _stop_cancel(claim, seq + len(events), now))
    if row["pause_requested_at"] is not None:
        rows = yield Query("execution_park_waiting", {
            "id": claim.execution_id, "wake_at": wake_at, "seen": seen_signal,
            "events": len(events), "now": now,
            "from_states": _names(sources_of(Status.PAUSED, among=[Status.RUNNING])),
        })
        yield from _events(claim.execution_id, seq + len(events), [("paused", {
            "owner": claim.owner, "epoch": claim.epoch,
            "reason": parked_reason(reason)})], now)
        return TransitionResult(True, execution_from(rows[0]))
    rows = yield Query("execution_block", {
        "id": claim.execution_id, "wake_at": wake_at, "seen": seen_signal,
        "events": len(events), "now": now,
        "from_states": _names(sources_of(Status.BLOCKED, among=[Status.RUNNING])),
    })
    updated = execution_from(rows[0])
    data: dict[str, JSON] = {"reason": reason, "owner": claim.owner, "epoch": claim.epoch}
    if wake_at is not None:
        data["wake_at"] = wake_at.isoformat()
    if updated.status == Status.PENDING:
        data["woken"] = "already due" if updated.signal_seq == seen_signal else "signalled"
    yield from _events(claim.execution_id, seq + len(events), [(str(updated.status), data)], now)
    return TransitionResult(True, updated)


def spawn_if_owned(
    claim: Claim,
    children: Sequence[NewExecution],
    events: Sequence[tuple[str, JSON]],
    now: datetime | None,
) -> Op:
    """Create child (or top-level) executions together with the parent's journal events:
    a crash can neither lose a child nor create it twice (ids are deterministic)."""
    for kind, _ in events:
        check_journal_kind(kind)
    row = yield from _fenced(claim, now)
    if row is None:
        return (yield from _late(claim, "spawn", {"children": [str(c.id) for c in children]},
                                 now))
    # two statements however many children (a reconciler may schedule thousands at once):
    # the new ones inserted (an id already there is left as it is), then their events
    rows: list[Row] = []
    if children:
        rows = yield Query("execution_insert_children", {"now": now, "rows": JsonParam([{
            "id": str(c.id), "ffqn": c.ffqn, "params": c.params,
            "deployment_id": c.deployment_id,
            "parent_id": str(c.parent_id) if c.parent_id else None, "join_set": c.join_set,
            "scheduled_at": cast(JSON, c.scheduled_at),  # a time: encoded by the backend
        } for c in children])})
    created = sorted((execution_from(r) for r in rows), key=lambda e: e.id)
    if created:
        yield Query("history_append_many", {"now": now, "rows": JsonParam([{
            "execution_id": str(e.id), "seq": 1, "kind": str(e.status), "data": {
                "ffqn": e.ffqn, "params": e.params, "deployment_id": e.deployment_id,
                "parent_id": str(e.parent_id) if e.parent_id else None,
                "join_set": e.join_set, "created_by": str(claim.execution_id)},
        } for e in created])})
    yield Query("execution_bump_history", {"id": claim.execution_id, "by": len(events)})
    if len(events) > 1:
        yield Query("history_append_many", {"now": now, "rows": JsonParam([
            {"execution_id": str(claim.execution_id), "seq": row["history_seq"] + i,
             "kind": kind, "data": data} for i, (kind, data) in enumerate(events, 1)])})
    else:
        yield from _events(claim.execution_id, row["history_seq"], events, now)
    return TransitionResult(True, None)


def take_message_if_owned(claim: Claim, topic: str, pos: int, now: datetime | None) -> Op:
    """Take the oldest unread message on ``topic`` and record it in the journal at ``pos``,
    in one transaction: delivered exactly once."""
    row = yield from _fenced(claim, now)
    if row is None:
        late = yield from _late(claim, "receive", {"topic": topic, "pos": pos}, now)
        return Taken(False, None, late.execution.signal_seq if late.execution else 0)
    rows = yield Query("message_oldest_open", {"execution_id": claim.execution_id,
                                               "topic": topic})
    found = _one(rows)
    if found is None:
        return Taken(True, None, row["signal_seq"])
    yield Query("message_consume", {"message_id": found["message_id"], "pos": pos, "now": now})
    message = message_from(found)
    yield Query("execution_bump_history", {"id": claim.execution_id, "by": 1})
    yield from _events(claim.execution_id, row["history_seq"], [("message_received", {
        "pos": pos, "topic": topic, "message_id": message.id, "payload": message.payload,
    })], now)
    return Taken(True, message, row["signal_seq"])


def stop_if_owned(claim: Claim, kind: InterruptKind, now: datetime | None) -> Op:
    """The worker acting on an interrupt at a step boundary.

    cancel: running -> cancelled, or -> blocked while children it may not cancel are still
    running (the last one to end records it cancelled). pause: running -> paused; if the
    pause was withdrawn meanwhile, back to pending instead (it resumes from its journal).
    """
    row = yield from _fenced(claim, now)
    if row is None:
        return (yield from _late(claim, kind, {"interrupt": kind}, now))
    seq = row["history_seq"]
    base: dict[str, JSON] = {"owner": claim.owner, "epoch": claim.epoch}
    if kind is InterruptKind.PAUSE:
        if row["pause_requested_at"] is None:
            rows = yield Query("execution_release_locked", {
                "id": claim.execution_id, "now": now,
                "from_states": _names(sources_of(Status.PENDING, among=[Status.RUNNING])),
            })
            yield from _events(claim.execution_id, seq, [("pending", {
                **base, "reason": "pause withdrawn before it parked"})], now)
            return TransitionResult(True, execution_from(rows[0]))
        rows = yield Query("execution_park", {
            "id": claim.execution_id, "now": now,
            "from_states": _names(sources_of(Status.PAUSED, among=[Status.RUNNING])),
        })
        yield from _events(claim.execution_id, seq, [("paused", {
            **base, "reason": "pause requested; parked at a step boundary"})], now)
        return TransitionResult(True, execution_from(rows[0]))
    return (yield from _stop_cancel(claim, seq, now))


def _stop_cancel(claim: Claim, seq: int, now: datetime | None) -> Op:
    # children it spawned after the request are cancelled too (those it may cancel)
    yield from _cancel_subtree(claim.execution_id, "worker", now)
    rows = yield Query("execution_open_children", {"id": claim.execution_id})
    open_children = int(rows[0]["n"])
    target = Status.BLOCKED if open_children else Status.CANCELLED
    rows = yield Query("execution_stop_cancelled", {
        "id": claim.execution_id, "to_status": str(target), "now": now,
        "from_states": _names(sources_of(target, among=[Status.RUNNING])),
    })
    reason = (f"cancel requested; waiting for {open_children} children that cannot be "
              "cancelled" if open_children else "cancel requested; stopped at its next await")
    yield from _events(claim.execution_id, seq, [(str(target), {
        "owner": claim.owner, "epoch": claim.epoch, "reason": reason})], now)
    return TransitionResult(True, execution_from(rows[0]))


# -- an operator's retry ---------------------------------------------------------------------


def retry(old_id: uuid.UUID, new: NewExecution, replayed: Sequence[tuple[str, JSON]],
          actor: str | None, now: datetime | None, *, reason: str | None = None) -> Op:
    """A new execution retrying a failed one: pending, linked to it (``retry_of``), with the
    failed one's ``replayed`` journal events copied into its history after its ``pending``
    event, so that its run replays them. The failed execution is left unchanged. Refused
    unless it is ``failed`` or ``failed_transient``."""
    row = yield from _lock(old_id)
    if row is None:
        return ControlResult(None)
    old = execution_from(row)
    if old.status not in (Status.FAILED, Status.FAILED_TRANSIENT):
        return ControlResult(old, refused=f"execution is {old.status}: only a failed or "
                             "failed_transient execution can be retried")
    rows = yield Query("execution_insert_retry", {
        "id": new.id, "ffqn": new.ffqn, "params": JsonParam(new.params),
        "deployment_id": new.deployment_id, "retry_of": old_id, "now": now,
        "history_seq": 1 + len(replayed)})
    created = execution_from(rows[0])
    events: list[tuple[str, JSON]] = [("pending", _with_reason({
        "ffqn": created.ffqn, "params": created.params,
        "deployment_id": created.deployment_id, "retry_of": str(old_id), "by": actor,
        "replays": len(replayed)}, reason)), *replayed]
    yield from _events(created.id, 0, events, now)
    return ControlResult(created, changed=True)


# -- lease recovery -------------------------------------------------------------------------


def recover_expired(max_attempts: int, limit: int, from_states: list[str],
                    now: datetime | None) -> Op:
    """Executions whose lease expired: each decided by :func:`decide_recovery` from its
    record, then applied in one statement, each only while the lease it was decided on is
    still the expired one; one history event each (docs/workers.md)."""
    rows = yield Query("execution_expired_leases", {
        "limit": limit, "now": now, "terminal": TERMINAL_NAMES})
    if not rows:
        return []
    decided = {}
    for r in rows:
        decided[r["id"]] = (r, decide_recovery(Expired(
            owner=r["lease_owner"], attempt=int(r["attempt"]), max_attempts=max_attempts,
            cancel_requested=bool(r["cancel_requested"]),
            open_children=int(r["open_children"]))))
    updated = yield Query("execution_recover_many", {
        "now": now, "from_states": from_states,
        "rows": JsonParam([{"id": str(r["id"]), "owner": r["lease_owner"],
                            "epoch": r["lease_epoch"], "to_status": str(d.status),
                            "attempt": d.attempt, "error": d.error}
                           for r, d in decided.values()]),
    })
    done = {row["id"]: execution_from(row) for row in updated}
    out: list[Recovered] = []
    events: list[JSON] = []
    for eid, (r, d) in decided.items():  # in the order the leases expired
        e = done.get(eid)
        if e is None:
            continue
        events.append({"execution_id": str(eid), "seq": e.history_seq, "kind": str(e.status),
                       "data": {"reason": "lease expired", "owner": r["lease_owner"],
                                "epoch": r["lease_epoch"], "attempt": r["attempt"],
                                "max_attempts": max_attempts}})
        out.append(Recovered(e, r["lease_owner"], r["lease_epoch"], d.action))
    if events:
        yield Query("history_append_many", {"rows": JsonParam(events), "now": now})
    return out


# -- retention ------------------------------------------------------------------------------


def _uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def prune(cutoff: datetime, limit: int, after: tuple[datetime, uuid.UUID] | None,
          dry_run: bool) -> Op:
    """One retention batch (docs/operations.md, Retention): up to ``limit`` top-level
    executions that ended before ``cutoff`` (after the cursor), each with its family, as
    many families as hold at most ``limit`` executions together; the families
    :func:`decide_prune` lets go are deleted with their history, messages and cron slots,
    once locked and found still ended (a dry run counts them and stops there). A family
    larger than ``limit`` alone goes a part at a time (:func:`leaves_order`): the cursor
    stays on its root until its last part."""
    roots = yield Query("prune_roots", {
        "cutoff": cutoff, "limit": limit,
        "after_at": after[0] if after else None, "after_id": after[1] if after else None})
    if not roots:
        return PruneBatch(roots=0, cursor=None)
    rows = yield Query("prune_families", {
        "cutoff": cutoff, "roots": [_uuid(r["id"]) for r in roots]})
    members = []
    for r in rows:
        retried = r["retried_by"]
        if isinstance(retried, str):
            retried = json.loads(retried)
        members.append((_uuid(r["root_id"]), Member(
            id=_uuid(r["id"]), status=Status(r["status"]),
            ended_before_cutoff=bool(r["ended_before_cutoff"]),
            retried_by=frozenset(_uuid(x) for x in retried or []),
            cron_latest=bool(r["cron_latest"]), flagged=bool(r["flagged"]),
            parent_id=_uuid(r["parent_id"]) if r["parent_id"] is not None else None,
            depth=int(r["depth"]))))
    by_root = {f.root: f for f in families_from(members)}
    # in the roots' order (a root read but gone since has no family: one of no members)
    families = [by_root.get(_uuid(r["id"]), Family(_uuid(r["id"]), ()))
                for r in roots]
    taken = within(families, limit)
    decision = decide_prune(taken)
    last = roots[len(taken) - 1]
    cursor: tuple[datetime, uuid.UUID] | None = (last["updated_at"], _uuid(last["id"]))
    more = len(roots) == limit or len(taken) < len(families)
    partial = False
    rest: tuple[uuid.UUID, ...] = ()
    if decision.delete and len(taken[0].members) > limit and not dry_run:
        # one family, too large for a batch (a dry run, which holds nothing, counts it whole)
        order = leaves_order(taken[0])
        if order:  # its deepest first; the cursor stays on its root
            decision = PruneDecision(delete=[Family(taken[0].root, tuple(order[:limit]))],
                                     kept={})
            cursor, more, partial = after, True, True
            rest = tuple(m.id for m in order[limit:])
    kept: dict[str, int] = {}
    for reason in decision.kept.values():
        kept[str(reason)] = kept.get(str(reason), 0) + 1
    handled = 0 if partial else len(taken)
    ids = decision.ids
    if not ids:
        return PruneBatch(roots=handled, cursor=cursor, kept=kept, more=more)
    if dry_run:
        history = yield Query("prune_count_history", {"ids": ids})
        messages = yield Query("prune_count_messages", {"ids": ids})
        return PruneBatch(roots=handled, cursor=cursor, executions=len(ids),
                          history=int(history[0]["n"]), messages=int(messages[0]["n"]),
                          kept=kept, more=more, partial=partial)
    # under the lock, again: a row that changed since it was read (no longer ended before
    # the cutoff), or a retry of one made since, keeps its family this time
    locked = yield Query("prune_lock", {"ids": ids, "cutoff": cutoff})
    retried = yield Query("prune_retried_by", {"ids": ids})
    still = {_uuid(r["id"]) for r in locked}
    held = {_uuid(r["id"]) for r in retried}
    going = [f for f in decision.delete if f.ids <= still and not f.ids & held]
    while True:  # a family kept now may hold back the originals its members retried
        going_ids: set[uuid.UUID] = set().union(*(f.ids for f in going))
        stay = [f for f in going if any(not m.retried_by <= going_ids for m in f.members)]
        if not stay:
            break
        going = [f for f in going if f not in stay]
    if len(going) < len(decision.delete):
        kept["changed"] = kept.get("changed", 0) + len(decision.delete) - len(going)
    ids = [m.id for f in going for m in f.members]
    if not ids:
        if partial:  # the part changed under us: its family is passed over this time
            first = roots[0]
            return PruneBatch(roots=1, cursor=(first["updated_at"], _uuid(first["id"])),
                              kept=kept, more=more)
        return PruneBatch(roots=handled, cursor=cursor, kept=kept, more=more)
    counts = yield from _prune_delete(ids)
    return PruneBatch(roots=handled, cursor=cursor, kept=kept, more=more, partial=partial,
                      rest=rest, **counts)


def _prune_delete(ids: list[uuid.UUID]) -> Op:
    """Delete these executions with their messages, history and cron slots, and add the
    counts to the database's totals (veracity_pruned_total); the counts."""
    messages = yield Query("prune_delete_messages", {"ids": ids})
    history = yield Query("prune_delete_history", {"ids": ids})
    yield Query("prune_delete_cron_slots", {"ids": ids})
    deleted = yield Query("prune_delete_executions", {"ids": ids})
    yield Query("prune_counted", {"executions": len(deleted), "history": len(history),
                                  "messages": len(messages)})
    return {"executions": len(deleted), "history": len(history), "messages": len(messages)}


def prune_rest(cutoff: datetime, limit: int, rest: Sequence[uuid.UUID]) -> Op:
    """The next part of a family too large for one batch, in the order the batch that read
    it decided (:func:`leaves_order`: each member after everything below it): the first
    ``limit`` of ``rest``, once locked and found still ended before the cutoff, unflagged
    and retried by none that stays. If any is not, nothing goes and ``rest`` is dropped:
    the next batch reads the family again."""
    part = list(rest[:limit])
    locked = yield Query("prune_lock", {"ids": part, "cutoff": cutoff})
    retried = yield Query("prune_retried_by", {"ids": part})
    if {_uuid(r["id"]) for r in locked} != set(part) or retried:
        return PruneBatch(roots=0, cursor=None, kept={"changed": 1}, more=True,
                          partial=True)
    counts = yield from _prune_delete(part)
    return PruneBatch(roots=0, cursor=None, more=True, partial=True,
                      rest=tuple(rest[limit:]), **counts)


def retention_totals() -> Op:
    rows = yield Query("retention_totals", {})
    return {str(r["kind"]): int(r["deleted"]) for r in rows}


def prune_count(cutoff: datetime) -> Op:
    rows = yield Query("prune_count", {"cutoff": cutoff})
    return int(rows[0]["n"])


# -- reads ---------------------------------------------------------------------------------


def children(parent_id: uuid.UUID, join_set: str | None) -> Op:
    """The parent's signal (read first), then its children in the order they ended."""
    rows = yield Query("execution_signal", {"id": parent_id})
    signal = int(rows[0]["signal_seq"]) if rows else 0
    rows = yield Query("execution_children", {"parent_id": parent_id, "join_set": join_set})
    return [execution_from(r) for r in rows], signal


def interrupts(owner: str) -> Op:
    rows = yield Query("execution_interrupts", {"owner": owner})
    return [
        Interrupt(Claim(r["id"], owner, r["lease_epoch"]),
                  InterruptKind.CANCEL if r["cancel_requested_at"] is not None
                  else InterruptKind.PAUSE)
        for r in rows
    ]


# -- operator requests ---------------------------------------------------------------------


def wake_due(limit: int, now: datetime | None) -> Op:
    """Blocked executions whose timer is due become pending."""
    rows = yield Query("execution_wake_due", {
        "limit": limit, "now": now,
        "from_states": _names(sources_of(Status.PENDING, among=[Status.BLOCKED])),
    })
    woken = [execution_from(r) for r in rows]
    for e in woken:
        yield from _events(e.id, e.history_seq - 1, [("pending", {"reason": "timer"})], now)
    return woken


def send_message(execution_id: uuid.UUID, topic: str, payload: JSON,
                 now: datetime | None, *, actor: str | None = None,
                 reason: str | None = None) -> Op:
    row = yield from _lock(execution_id)
    if row is None:
        return ControlResult(None)
    current = execution_from(row)
    if current.status.is_terminal:
        return ControlResult(current, refused=f"execution is {current.status}")
    rows = yield Query("message_insert", {
        "execution_id": execution_id, "topic": topic, "payload": JsonParam(payload),
        "now": now,
    })
    message = message_from(rows[0])
    # a blocked execution wakes up, unless its cancellation only waits for its children
    wake = current.status == Status.BLOCKED and current.cancel_requested_at is None
    rows = yield Query("execution_signal_bump", {
        "id": execution_id, "wake": wake, "now": now,
        "events": 2 if wake else 1,
        "from_states": _names(sources_of(Status.PENDING, among=[Status.BLOCKED])),
    })
    arrived: dict[str, JSON] = {"message_id": message.id, "topic": topic}
    if actor is not None:
        arrived["by"] = actor
    events: list[tuple[str, JSON]] = [("message_arrived", _with_reason(arrived, reason))]
    if wake:
        events.append(("pending", {"reason": "message arrived", "topic": topic}))
    yield from _events(execution_id, current.history_seq, events, now)
    return ControlResult(execution_from(rows[0]), changed=True, message=message)


def _with_reason(data: dict[str, JSON], reason: str | None) -> dict[str, JSON]:
    """An operator's written reason goes into the event, when one was given."""
    if reason is not None:
        data["reason"] = reason
    return data


def cancel(execution_id: uuid.UUID, actor: str | None, now: datetime | None, *,
           reason: str | None = None) -> Op:
    """Request cancellation of an execution and, recursively, of its cancellable children;
    record cancelled at once whatever is not running and has no unfinished children. The
    caller has checked that the root's name ends in -cancellable."""
    row = yield from _lock(execution_id)
    if row is None:
        return ControlResult(None)
    root = execution_from(row)
    if root.status.is_terminal:
        return ControlResult(root)
    marked = yield from _cancel_subtree(execution_id, actor, now, reason)
    after = yield from _get(execution_id)
    return ControlResult(after, changed=bool(marked))


def cancel_many(ids: Sequence[uuid.UUID], actor: str | None, now: datetime | None, *,
                reason: str | None = None) -> Op:
    """Cancel many executions in one transaction, each as :func:`cancel` would, answered in
    the order of ``ids``: None for an id that does not exist, refused (code
    ``not_cancellable``) for an unfinished execution whose name does not end in
    -cancellable. Locked in id order (two batches never wait on each other in a cycle); a
    repeated id is answered as its first occurrence. Those without unfinished children (the
    usual case) are marked, settled and given their events in a fixed number of
    statements; the others as :func:`cancel`, one tree at a time."""
    unique = sorted(set(ids))
    locked = {r["id"]: execution_from(r)
              for r in (yield Query("execution_lock_many", {"ids": unique}))}
    done: dict[uuid.UUID, ControlResult] = {}
    targets: list[uuid.UUID] = []
    for execution_id in unique:
        current = locked.get(execution_id)
        if current is None:
            done[execution_id] = ControlResult(None)
        elif current.status.is_terminal:
            done[execution_id] = ControlResult(current)
        elif not current.ffqn.endswith(CANCELLABLE_SUFFIX):
            done[execution_id] = ControlResult(
                current, code="not_cancellable",
                refused=f"{current.ffqn} cannot be cancelled (it is {current.status}): only "
                        f"workflows whose name ends in {CANCELLABLE_SUFFIX} can; pause it "
                        "instead")
        else:
            targets.append(execution_id)
    if not targets:
        return [done[i] for i in ids]
    trees = {r["id"] for r in (yield Query("execution_with_open_children", {
        "ids": targets, "terminal": TERMINAL_NAMES}))}
    alone = [i for i in targets if i not in trees]
    if alone:
        rows = yield Query("execution_cancel_mark_many", {
            "ids": alone, "now": now, "terminal": TERMINAL_NAMES})
        marked = {r["id"] for r in rows}
        if rows:
            yield Query("history_append_many", {"now": now, "rows": JsonParam([
                {"execution_id": str(r["id"]), "seq": int(r["history_seq"]),
                 "kind": "cancel_requested",
                 "data": _with_reason({"by": actor, "root": str(r["id"])}, reason)}
                for r in rows])})
        settled = yield Query("execution_cancel_settle_many", {
            "ids": alone, "now": now, "terminal": TERMINAL_NAMES,
            "from_states": _names(
                [s for s in sources_of(Status.CANCELLED) if s != Status.RUNNING])})
        if settled:
            yield Query("history_append_many", {"now": now, "rows": JsonParam([
                {"execution_id": str(r["id"]), "seq": int(r["history_seq"]),
                 "kind": "cancelled", "data": {"by": actor, "reason": "cancelled on request"}}
                for r in settled])})
        after = {r["id"]: execution_from(r)
                 for r in (yield Query("execution_lock_many", {"ids": alone}))}
        for execution_id in alone:
            done[execution_id] = ControlResult(after[execution_id],
                                               changed=execution_id in marked)
    for execution_id in targets:
        if execution_id in trees:
            subtree = yield from _cancel_subtree(execution_id, actor, now, reason)
            done[execution_id] = ControlResult((yield from _get(execution_id)),
                                               changed=bool(subtree))
    return [done[i] for i in ids]


def _cancel_subtree(execution_id: uuid.UUID, actor: str | None, now: datetime | None,
                    reason: str | None = None) -> Op:
    """Mark the execution and its cancellable descendants cancel-requested, then record
    cancelled whatever is not running and has no unfinished children."""
    rows = yield Query("execution_cancel_mark", {
        "id": execution_id, "now": now, "terminal": TERMINAL_NAMES,
    })
    marked = [execution_from(r) for r in rows]
    for e in marked:
        yield from _events(e.id, e.history_seq - 1, [("cancel_requested", _with_reason({
            "by": actor, "root": str(execution_id)}, reason))], now)
    # settle bottom-up: whatever is not running and has no open children ends now; the
    # trigger records each parent cancelled once its last child has ended
    while True:
        rows = yield Query("execution_cancel_settle", {
            "root": execution_id, "now": now, "terminal": TERMINAL_NAMES,
            "from_states": _names(
                [s for s in sources_of(Status.CANCELLED) if s != Status.RUNNING]),
        })
        if not rows:
            break
        for r in rows:
            e = execution_from(r)
            yield from _events(e.id, e.history_seq - 1, [("cancelled", {
                "by": actor, "reason": "cancelled on request"
                if e.id == execution_id else "cancelled with its parent"})], now)
    return marked


def pause(execution_id: uuid.UUID, actor: str | None, now: datetime | None, *,
          reason: str | None = None) -> Op:
    row = yield from _lock(execution_id)
    if row is None:
        return ControlResult(None)
    current = execution_from(row)
    if current.status.is_terminal:
        return ControlResult(current, refused=f"execution is {current.status}")
    if current.status == Status.RUNNING and current.engine is not None:
        return ControlResult(current, code="not_pausable", refused=(
            f"it runs in the engine {current.engine!r}, which cannot pause a run: cancel it "
            "(if its name allows) or resolve it instead"))
    if current.status == Status.PAUSED or (
        current.status == Status.RUNNING and current.pause_requested_at is not None
    ):
        return ControlResult(current)
    if current.status == Status.RUNNING:
        rows = yield Query("execution_request_pause", {"id": execution_id, "now": now})
        yield from _events(execution_id, current.history_seq, [("pause_requested", _with_reason({
            "by": actor}, reason))], now)
        return ControlResult(execution_from(rows[0]), changed=True)
    rows = yield Query("execution_pause", {
        "id": execution_id, "now": now,
        "from_states": _names(sources_of(Status.PAUSED, among=[Status.PENDING, Status.BLOCKED])),
    })
    yield from _events(execution_id, current.history_seq, [("paused", _with_reason({
        "by": actor, "from": str(current.status)}, reason))], now)
    return ControlResult(execution_from(rows[0]), changed=True)


def unpause(execution_id: uuid.UUID, actor: str | None, now: datetime | None, *,
            reason: str | None = None) -> Op:
    row = yield from _lock(execution_id)
    if row is None:
        return ControlResult(None)
    current = execution_from(row)
    if current.status == Status.RUNNING and current.pause_requested_at is not None:
        rows = yield Query("execution_withdraw_pause", {"id": execution_id, "now": now})
        yield from _events(execution_id, current.history_seq, [("pause_withdrawn", _with_reason({
            "by": actor}, reason))], now)
        return ControlResult(execution_from(rows[0]), changed=True)
    if current.status != Status.PAUSED:
        return ControlResult(current, refused=f"execution is {current.status}, not paused")
    rows = yield Query("execution_unpause", {
        "id": execution_id, "now": now,
        "from_states": _names(sources_of(Status.PENDING, among=[Status.PAUSED])),
    })
    updated = execution_from(rows[0])
    yield from _events(execution_id, current.history_seq, [(str(updated.status), {
        "by": actor, "reason": "unpaused" if reason is None else f"unpaused: {reason}"})], now)
    return ControlResult(updated, changed=True)


# -- external engines (docs/external.md) -----------------------------------------------------


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def delegate_if_owned(claim: Claim, engine: str, callback_token_hash: str,
                      now: datetime | None) -> Op:
    """The worker, before it calls the engine: the execution stays running, now delegated
    (engine set, no external id yet, no lease), and the trigger time is recorded. A crash
    from here on leaves it without an external id: the reconciler's fourth row.

    A cancel or pause requested since the claim is carried out here instead, and nothing
    is triggered: the answer's execution is then not delegated (``engine`` is None).
    """
    row = yield from _fenced(claim, now)
    if row is None:
        return (yield from _late(claim, "trigger", {"engine": engine}, now))
    if row["cancel_requested_at"] is not None:
        return (yield from _stop_cancel(claim, row["history_seq"], now))
    if row["pause_requested_at"] is not None:
        return (yield from stop_if_owned(claim, InterruptKind.PAUSE, now))
    rows = yield Query("execution_delegate", {
        "id": claim.execution_id, "engine": engine, "token_hash": callback_token_hash,
        "now": now,
    })
    updated = execution_from(rows[0])
    yield from _events(claim.execution_id, row["history_seq"], [("trigger_sending", {
        "engine": engine, "owner": claim.owner, "epoch": claim.epoch,
        "triggered_at": updated.triggered_at.isoformat() if updated.triggered_at else None,
    })], now)
    return TransitionResult(True, updated)


def _delegated_without_id(e: Execution) -> bool:
    return e.status == Status.RUNNING and e.engine is not None and e.external_execution_id is None


def record_external_id(execution_id: uuid.UUID, external_id: str, actor: str,
                       reason: str | None, now: datetime | None) -> Op:
    row = yield from _lock(execution_id)
    if row is None:
        return ControlResult(None)
    current = execution_from(row)
    if not _delegated_without_id(current):
        if current.flag_kind == str(FlagKind.FORCED) and current.external_execution_id is None:
            # ended on an operator's word while its trigger was unanswered: the engine's id
            # arriving now says the run exists and may be going; the flagged list says so
            yield Query("execution_flag_note", {"id": execution_id, "note": (
                f"; the engine's id {external_id} arrived afterwards: its run exists and "
                "may still be going, check it in the engine")})
        yield Query("execution_bump_history", {"id": execution_id, "by": 1})
        yield from _events(execution_id, current.history_seq, [("late_report", {
            "report": "external_id", "payload": {"external_execution_id": external_id},
            "by": actor, "reason": f"execution is {current.status}"
            + (f" with external id {current.external_execution_id}"
               if current.external_execution_id else ""),
        })], now)
        return ControlResult(current, refused=f"execution is {current.status}"
                             + (" and already has an external id"
                                if current.external_execution_id else ""))
    rows = yield Query("execution_set_external_id", {
        "id": execution_id, "external_id": external_id, "now": now})
    data: dict[str, JSON] = {"external_execution_id": external_id, "by": actor}
    if reason:
        data["reason"] = reason
    yield from _events(execution_id, current.history_seq, [("external_started", data)], now)
    return ControlResult(execution_from(rows[0]), changed=True)


def end_external(execution_id: uuid.UUID, *, to: Status, expected_external_id: str | None,
                 any_external_id: bool, result: JSON, error: JSON, event: dict[str, JSON],
                 now: datetime | None) -> Op:
    """End a delegated execution (a refused trigger, the reconciler, an operator): only if
    it is still running, delegated, and (unless ``any_external_id``) still has the external
    id the caller looked at."""
    row = yield from _lock(execution_id)
    if row is None:
        return ControlResult(None)
    current = execution_from(row)
    if (current.status != Status.RUNNING or current.engine is None
            or (not any_external_id
                and current.external_execution_id != expected_external_id)):
        return ControlResult(current, refused=f"execution is {current.status}")
    rows = yield Query("execution_end_external", {
        "id": execution_id, "to_status": str(to), "result": JsonParam(result)
        if to == Status.COMPLETED else None,
        "error": JsonParam(error) if error is not None else None, "now": now,
        "from_states": _names(sources_of(to, among=[Status.RUNNING])),
    })
    yield from _events(execution_id, current.history_seq, [(str(to), event)], now)
    return ControlResult(execution_from(rows[0]), changed=True)


def callback(execution_id: uuid.UUID, token: str, report: CallbackReport, payload: JSON,
             transient: bool, now: datetime | None) -> Op:
    """The engine's /complete or /fail. Authenticated by the per-execution token (stored
    hashed, compared in constant time). completed only ever comes from here (with its
    result) or from a worker. A repeat of the same report changes nothing; a report on an
    execution that ended otherwise is kept in history as a late report."""
    row = yield from _lock(execution_id)
    if row is None:
        return CallbackResult(CallbackOutcome.NOT_FOUND, None)
    current = execution_from(row)
    expected = current.callback_token_hash or ""
    if not expected or not hmac.compare_digest(expected, token_hash(token)):
        return CallbackResult(CallbackOutcome.UNAUTHORIZED, None)
    if report is CallbackReport.COMPLETE:
        target, result, error = Status.COMPLETED, payload, None
    else:
        target = Status.FAILED_TRANSIENT if transient else Status.FAILED
        result, error = None, payload
    if current.status == Status.RUNNING and current.engine is not None:
        rows = yield Query("execution_end_external", {
            "id": execution_id, "to_status": str(target),
            "result": JsonParam(result) if target == Status.COMPLETED else None,
            "error": JsonParam(error) if error is not None else None, "now": now,
            "from_states": _names(sources_of(target, among=[Status.RUNNING])),
        })
        data: dict[str, JSON] = {
            "by": "callback", "engine": current.engine,
            "external_execution_id": current.external_execution_id,
        }
        overtaken = _overtaken(current)
        if overtaken:
            data["overtook"] = overtaken
        yield from _events(execution_id, current.history_seq, [(str(target), data)], now)
        return CallbackResult(CallbackOutcome.APPLIED, execution_from(rows[0]))
    same = current.status == target and (
        current.result == result if target == Status.COMPLETED else current.error == error)
    if same:
        return CallbackResult(CallbackOutcome.REPEAT, current)
    yield Query("execution_bump_history", {"id": execution_id, "by": 1})
    yield from _events(execution_id, current.history_seq, [("late_report", {
        "report": report, "payload": payload, "transient": transient,
        "reason": f"execution is {current.status}",
    })], now)
    return CallbackResult(CallbackOutcome.CONFLICT, current)


def _overtaken(e: Execution) -> list[JSON]:
    """An operator's request to end the run that the engine's own report overtook: its
    outcome stands (it is what happened), and the history says the request lost the race.
    (A cancel that lost is recorded by the database itself, as a ``late_report`` of the
    cancel, for every kind of execution.)"""
    lost: list[JSON] = []
    if isinstance(e.end_request, dict):
        lost.append({"request": f"resolve {e.end_request.get('action')}",
                     "by": e.end_request.get("by"),
                     "requested_at": e.end_requested_at.isoformat()
                     if e.end_requested_at else None,
                     "outcome": "the engine reported first; its outcome stands"})
    return lost


def external_running(limit: int, after: uuid.UUID | None) -> Op:
    rows = yield Query("execution_external_running", {"limit": limit, "after": after})
    return [execution_from(r) for r in rows]


def leased_to(owner: str, now: datetime | None) -> Op:
    rows = yield Query("execution_leased_to", {"owner": owner, "now": now})
    return [execution_from(r) for r in rows]


def reconcile_apply(actions: Sequence[ReconcileAction], now: datetime | None) -> Op:
    """The writes decided by looks at delegated executions (a reconciler tick's page, or
    one operator request), in one transaction and a fixed number of statements whatever
    their number: lock the rows, end the terminated ones in one statement, flag the
    flagged ones in another, clear the flags that no longer hold in a third, append every
    history event in a fourth. Each action applies only if its execution is still
    running, delegated, with the external id the look inspected; at most one per
    execution."""
    for action in actions:
        if not isinstance(action.kind, WriteKind):
            raise ValueError(f"unknown reconciler action {action.kind!r}")
    rows = yield Query("execution_lock_many", {
        "ids": sorted({a.execution_id for a in actions})})
    current = {row["id"]: execution_from(row) for row in rows}
    applied: list[ReconcileAction] = []
    ends: list[JSON] = []
    flags: list[JSON] = []
    unflags: list[JSON] = []
    events: list[JSON] = []
    for action in actions:
        e = current.pop(action.execution_id, None)  # one action per execution at most
        if (e is None or e.status != Status.RUNNING or e.engine is None
                or e.external_execution_id != action.external_execution_id):
            continue
        data: dict[str, JSON] = {"by": "reconciler", "reason": action.reason, **action.data}
        if action.kind is WriteKind.TERMINATE:
            error = action.error if action.error is not None else {
                "code": "reconciler", "message": action.reason, **action.data}
            ends.append({"id": str(e.id), "to_status": str(action.to),
                         "error": error if action.to == Status.FAILED_TRANSIENT else None})
            kind = str(action.to)
        elif action.kind is WriteKind.FLAG:
            assert action.flag is not None
            if e.flag_kind == action.flag and e.flag_reason == action.reason:
                continue
            if e.flag_kind in NO_ID_FLAGS and action.flag in NO_ID_FLAGS:
                continue  # the first, more specific reason stays (e.g. the trigger's)
            flags.append({"id": str(e.id), "reason": action.reason, "kind": str(action.flag)})
            kind = "flagged"
            data["flag_kind"] = str(action.flag)
        else:
            if e.flagged_at is None:
                continue
            unflags.append({"id": str(e.id)})
            kind = "unflagged"
            data["was"] = {"flag_kind": e.flag_kind, "flag_reason": e.flag_reason}
        events.append({"execution_id": str(e.id), "seq": e.history_seq + 1, "kind": kind,
                       "data": data})
        applied.append(action)
    if ends:
        yield Query("execution_end_external_many", {
            "rows": JsonParam(ends), "now": now,
            "from_states": _names(sources_of(Status.FAILED_TRANSIENT, among=[Status.RUNNING])
                                  + sources_of(Status.CANCELLED, among=[Status.RUNNING])),
        })
    if flags:
        yield Query("execution_flag_many", {"rows": JsonParam(flags), "now": now})
    if unflags:
        yield Query("execution_unflag_many", {"rows": JsonParam(unflags)})
    if events:
        yield Query("history_append_many", {"rows": JsonParam(events), "now": now})
    return applied


def flag_counts() -> Op:
    rows = yield Query("execution_flag_counts", {})
    return {str(r["flag_kind"]): int(r["n"]) for r in rows}


def status_counts() -> Op:
    rows = yield Query("execution_status_counts", {})
    return {str(r["status"]): int(r["n"]) for r in rows}


def counts_in(statuses: list[str]) -> Op:
    rows = yield Query("execution_counts_in", {"statuses": statuses})
    return {str(r["status"]): int(r["n"]) for r in rows}


def children_of(parent_ids: list[uuid.UUID], limit: int) -> Op:
    rows = yield Query("execution_children_of", {"parent_ids": parent_ids, "limit": limit})
    return [execution_from(r) for r in rows]


def history_of_kinds(execution_id: uuid.UUID, kinds: list[str], after_seq: int,
                     limit: int) -> Op:
    rows = yield Query("history_list_kinds", {
        "id": execution_id, "kinds": kinds, "after_seq": after_seq, "limit": limit})
    return [event_from(r) for r in rows]


def history_kinds(execution_id: uuid.UUID) -> Op:
    rows = yield Query("history_kind_counts", {"id": execution_id})
    return {str(r["kind"]): int(r["n"]) for r in rows}


def resolve(execution_id: uuid.UUID, action: ResolveAction, external_id: str | None, reason: str,
            actor: str, unconfirmed: str | None, expected_external_id: str | None,
            now: datetime | None) -> Op:
    """An operator resolves a running delegated execution, with a written reason.

    ``attach``: attach the engine's id (the next look reconciles it normally).
    ``fail`` / ``cancel`` without ``unconfirmed``: record the request (``end_request`` and
    an ``end_requested`` event); the execution stays running until a look finds the
    engine run finished, which ends it through :func:`reconcile_apply`.
    ``fail`` / ``cancel`` with ``unconfirmed`` (why the engine did not confirm): end it
    now, ``failed_transient`` or ``cancelled``, and keep it on the flagged list as forced.
    Both ends of the request apply only while the external id is ``expected_external_id``
    (the one the operator's request was decided on).
    """
    row = yield from _lock(execution_id)
    if row is None:
        return ControlResult(None)
    current = execution_from(row)
    if current.status != Status.RUNNING or current.engine is None:
        return ControlResult(current, refused=f"execution is {current.status}"
                             + ("" if current.engine else ", not delegated to an engine"))
    if action is ResolveAction.ATTACH:
        if current.external_execution_id is not None:
            return ControlResult(current, refused="execution already has an external id "
                                 f"({current.external_execution_id})")
        assert external_id is not None
        return (yield from record_external_id(execution_id, external_id, actor, reason, now))
    end = OperatorEnd(action)
    if current.external_execution_id != expected_external_id:
        return ControlResult(current, refused="its external id changed meanwhile (now "
                             f"{current.external_execution_id}): resolve it again",
                             code="engine_not_confirmed")
    target = Status.FAILED_TRANSIENT if end is OperatorEnd.FAIL else Status.CANCELLED
    if unconfirmed is None:
        if current.external_execution_id is None:
            return ControlResult(current, refused="it has no external id: the engine cannot "
                                 "confirm anything", code="engine_not_confirmed")
        rows = yield Query("execution_request_end", {
            "id": execution_id, "now": now,
            "request": JsonParam({"action": str(end), "reason": reason, "by": actor})})
        yield from _events(execution_id, current.history_seq, [("end_requested", {
            "action": str(end), "by": actor, "reason": reason,
            "external_execution_id": current.external_execution_id,
            "ends_as": str(target)})], now)
        return ControlResult(execution_from(rows[0]), changed=True)
    flag = (f"ended {target} by {actor} without the engine's confirmation ({unconfirmed}): "
            "check the run in the engine")
    rows = yield Query("execution_end_forced", {
        "id": execution_id, "to_status": str(target), "now": now, "reason": flag,
        "error": JsonParam({"code": "operator", "message": reason, "by": actor,
                            "engine_confirmed": False})
        if target == Status.FAILED_TRANSIENT else None,
        "from_states": _names(sources_of(target, among=[Status.RUNNING])),
    })
    yield from _events(execution_id, current.history_seq, [(str(target), {
        "by": actor, "reason": reason, "resolved": True, "engine_confirmed": False,
        "why_unconfirmed": unconfirmed,
        "external_execution_id": current.external_execution_id})], now)
    return ControlResult(execution_from(rows[0]), changed=True)


# -- cron (docs/cron.md) ----------------------------------------------------------------------


def cron_record_from(row: Row) -> CronRecord:
    return CronRecord(
        name=row["name"], schedule=row["schedule"], timezone=row["timezone"],
        first_seen_at=row["first_seen_at"], last_slot_at=row["last_slot_at"],
        last_execution_id=row["last_execution_id"],
        last_status=Status(row["last_status"]) if row["last_status"] is not None else None)


def cron_records(names: Sequence[str]) -> Op:
    rows = yield Query("cron_entry_records", {"names": list(names)})
    return {row["name"]: cron_record_from(row) for row in rows}


def cron_register(definitions: Sequence[CronDefinition], now: datetime | None) -> Op:
    """Record the entries a server runs (first seen now unless recorded with the same
    schedule and time zone), then read them back."""
    if definitions:
        yield Query("cron_entry_register_many", {"rows": JsonParam([
            {"name": d.name, "schedule": d.schedule, "timezone": d.timezone}
            for d in sorted(definitions, key=lambda d: d.name)]), "now": now})
    return (yield from cron_records([d.name for d in definitions]))


def cron_fire(fires: Sequence[CronFire], now: datetime | None) -> Op:
    """Start slots in a fixed number of statements whatever their number: claim the keys
    (one insert; a key taken by another server, committed or not, is waited for, then
    skipped), insert the executions of the slots claimed (one insert) and their pending
    events (one insert). The unique key, not a lock, is what makes a slot start once."""
    ordered = sorted(fires, key=lambda f: (f.name, f.slot_at))
    rows = yield Query("cron_slot_claim_many", {"rows": JsonParam([
        {"name": f.name, "slot_at": f.slot_at, "execution_id": str(f.execution.id)}
        for f in ordered]), "now": now})
    claimed = {row["execution_id"] for row in rows}
    mine = [f for f in ordered if f.execution.id in claimed]
    if not mine:
        return mine
    yield Query("execution_insert_many", {"rows": JsonParam([
        {"id": str(f.execution.id), "ffqn": f.execution.ffqn, "params": f.execution.params,
         "deployment_id": f.execution.deployment_id, "scheduled_at": f.slot_at}
        for f in mine]), "now": now})
    yield Query("history_append_many", {"rows": JsonParam([
        {"execution_id": str(f.execution.id), "seq": 1, "kind": str(Status.PENDING),
         "data": {"ffqn": f.execution.ffqn, "params": f.execution.params,
                  "deployment_id": f.execution.deployment_id,
                  "scheduled_at": f.slot_at.isoformat(), "parent_id": None,
                  "join_set": None, "idempotency_key": None, "cron": f.event}}
        for f in mine]), "now": now})
    return mine

# -- deployments (docs/deployments.md) -------------------------------------------------------

UNFINISHED = [str(s) for s in Status if not s.is_terminal]


def deployment_from(row: Row) -> DeploymentRecord:
    return DeploymentRecord(id=row["deployment_id"], first_seen=row["first_seen"],
                            last_seen=row["last_seen"])


def _coverage(live_within: timedelta, deployment_id: str | None, now: datetime | None) -> Op:
    rows = yield Query("worker_live", {
        "live_within": live_within, "deployment_id": deployment_id, "now": now})
    return Coverage(LiveWorker(r["deployment_id"], frozenset(r["ffqns"]),
                               frozenset(r["upgrade_ffqns"])) for r in rows
                    if is_live(stopped_at=r["stopped_at"], last_heartbeat=r["last_heartbeat"],
                               heartbeat_interval=r["heartbeat_interval"],
                               now=r["db_now"], live_within=live_within))


def deployments(live_within: timedelta, now: datetime | None) -> Op:
    """Every deployment the registry knows, newest first, then those only unfinished
    executions carry (by id): with their unfinished executions by status, their live
    workers, and how many of their executions are stranded (core.deployments)."""
    coverage = yield from _coverage(live_within, None, now)
    records = [deployment_from(r) for r in (yield Query("deployment_rows", {}))]
    groups = yield Query("deployment_unfinished", {})
    unfinished: dict[str, dict[str, int]] = {}
    stranded: dict[str, int] = {}
    for g in groups:
        dep, status, n = g["deployment_id"], Status(g["status"]), int(g["n"])
        counts = unfinished.setdefault(dep, dict.fromkeys(UNFINISHED, 0))
        counts[str(status)] += n
        if coverage.stranded(status=status, ffqn=g["ffqn"], deployment_id=dep,
                             delegated=bool(g["delegated"])):
            stranded[dep] = stranded.get(dep, 0) + n
    known = {r.id for r in records}
    rows: list[tuple[str, datetime | None, datetime | None]] = [
        (r.id, r.first_seen, r.last_seen) for r in records]
    rows += [(dep, None, None) for dep in sorted(unfinished) if dep not in known]
    return [DeploymentSummary(
        id=dep, first_seen=first, last_seen=last,
        unfinished=unfinished.get(dep, dict.fromkeys(UNFINISHED, 0)),
        live_workers=coverage.live_workers(dep), stranded=stranded.get(dep, 0))
        for dep, first, last in rows]


def adopt(from_id: str, to_id: str, ffqn_prefix: str | None, actor: str,
          live_within: timedelta, now: datetime | None) -> Op:
    """Move the unfinished executions of ``from_id`` (those whose workflow name starts
    with ``ffqn_prefix``, if given) onto ``to_id``, each with an ``adopted`` event (from,
    to, by). Refused, changing nothing, when ``from_id`` is unknown (neither recorded nor
    carried by an unfinished execution), when ``to_id`` was never recorded by a server or
    worker (nothing would run them there), or while ``from_id`` has a live worker (its
    executions are not stranded: it may be running them)."""
    if from_id == to_id:
        raise ValueError("a deployment cannot adopt its own executions")
    target = _one((yield Query("deployment_get", {"id": to_id})))
    source = _one((yield Query("deployment_get", {"id": from_id})))
    if source is None:
        carried = yield Query("deployment_has_unfinished", {"id": from_id})
        if not carried:
            return Adopted([], code="not_found", refused=(
                f"deployment {from_id} is unknown: no server or worker recorded it and no "
                "unfinished execution belongs to it"))
    if target is None:
        return Adopted([], code="unknown_target", refused=(
            f"the current deployment {to_id} was never recorded by a server or worker, so "
            "nothing would run what it adopts: start the new deployment first, or run this "
            "with its configuration (app, deployment_id)"))
    coverage = yield from _coverage(live_within, from_id, now)
    live = coverage.live_workers(from_id)
    if live:
        return Adopted([], code="deployment_live", refused=(
            f"deployment {from_id} has {live} live worker{'s' if live != 1 else ''}: its "
            "executions are not stranded (they may be running); stop its workers first"))
    locked = yield Query("execution_adoptable", {"from_id": from_id,
                                                 "ffqn_prefix": ffqn_prefix})
    if not locked:
        return Adopted([])
    moved = yield Query("execution_adopt_many", {
        "ids": [r["id"] for r in locked], "from_id": from_id, "to_id": to_id})
    seqs = {r["id"]: int(r["history_seq"]) for r in moved}
    ids = [r["id"] for r in locked if r["id"] in seqs]
    yield Query("history_append_many", {"now": now, "rows": JsonParam([
        {"execution_id": str(eid), "seq": seqs[eid], "kind": "adopted",
         "data": {"from": from_id, "to": to_id, "by": actor}} for eid in ids])})
    yield Query("notify_pending", {})
    return Adopted(ids)


# -- what unfinished executions wait for (core.waiting) -------------------------------------


def waits_from(ids: Sequence[uuid.UUID], events: Sequence[Row], children: Sequence[Row]
               ) -> dict[uuid.UUID, WaitRecord]:
    """The records of ``execution_waits``: rows of ``history_newest_of_kinds`` and of
    ``execution_unfinished_children`` gathered by execution."""
    out = {i: WaitRecord() for i in ids}
    for r in events:
        out[r["execution_id"]].events[r["kind"]] = r["data"]
    for r in children:
        _, first = out[r["parent_id"]].children.setdefault(
            r["join_set"], (int(r["n"]), []))
        first.append(r["id"])
    return out
# -- batch submission ------------------------------------------------------------------------


def submitted_execution(new: NewExecution, row: Row) -> Execution:
    """The execution a submission (alone or in a batch) inserted, as
    :func:`execution_from` would read its row: what was sent, with the times the database
    chose (``row``: id, scheduled_at, created_at, updated_at) and the columns' values of a
    new row. Reading the whole rows back cost more than the rest of the insert
    (tests/store/test_submit_many.py and the conformance suite's submission tests compare
    the answers with the stored rows). A submission handed to an idle worker
    (``lease_owner`` in ``row``: PostgreSQL, docs/workers.md) is running, with the lease,
    start and history the database gave it."""
    owner = row.get("lease_owner")
    if owner is not None:
        return Execution(
            id=new.id, ffqn=new.ffqn, params=new.params, status=Status.RUNNING, result=None,
            error=None, attempt=1, deployment_id=new.deployment_id, parent_id=new.parent_id,
            idempotency_key=new.idempotency_key, scheduled_at=row["scheduled_at"],
            created_at=row["created_at"], updated_at=row["updated_at"], lease_owner=owner,
            lease_epoch=row["lease_epoch"], lease_expires_at=row["lease_expires_at"],
            history_seq=row["history_seq"], join_set=new.join_set,
            started_at=row["started_at"])
    return Execution(
        id=new.id, ffqn=new.ffqn, params=new.params,
        status=Status.PAUSED if new.paused else Status.PENDING, result=None, error=None,
        attempt=1, deployment_id=new.deployment_id, parent_id=new.parent_id,
        idempotency_key=new.idempotency_key, scheduled_at=row["scheduled_at"],
        created_at=row["created_at"], updated_at=row["updated_at"], lease_owner=None,
        lease_epoch=0, lease_expires_at=None, history_seq=1, join_set=new.join_set,
        paused_from=str(Status.PENDING) if new.paused else None)


class ConflictVanished(Exception):
    """A submission's idempotency key named an execution that was gone when read:
    retention deleted it between the insert that found it and the read (its key is free
    again, docs/operations.md, Retention). The submission is run again from the start."""


def submit_many(items: Sequence[NewExecution], now: datetime | None, *,
                all_or_nothing: bool = True) -> Op:
    """A batch of submissions in a fixed number of statements: insert every item whose key
    is new to the batch (a key stored already, committed or not, is waited for and
    skipped), their first events, and read what the keys skipped name. Each item is
    answered in order; a key reused with a different request refuses the whole batch
    (:class:`BatchConflict`, raised inside the transaction: nothing is written), unless
    not ``all_or_nothing``: then that item is answered the execution its key names, with
    that execution's digest, as :meth:`execution_submit` answers it, and the others are
    written."""
    first: dict[str, int] = {}
    inserting: list[NewExecution] = []
    for i, new in enumerate(items):
        if new.parent_id is not None or new.join_set is not None or new.retry_of is not None:
            raise ValueError("a batch submits top-level executions only")
        if new.idempotency_key is not None:
            if new.idempotency_key in first:
                continue
            first[new.idempotency_key] = i
        inserting.append(new)
    rows = yield Query("execution_submit_many", {"now": now, "rows": JsonParam([
        {"id": str(n.id), "ffqn": n.ffqn, "params": n.params, "paused": n.paused,
         "deployment_id": n.deployment_id, "idempotency_key": n.idempotency_key,
         "request_digest": n.request_digest, "scheduled_at": n.scheduled_at}
        for n in inserting])})
    sent = {n.id: n for n in inserting}
    inserted = {r["id"]: submitted_execution(sent[r["id"]], r) for r in rows}
    if rows and not rows[0]["events_written"]:
        # their first events, made from the rows (as execution_submit makes one)
        yield Query("history_of_submitted", {"ids": list(inserted)})
    by_id: dict[uuid.UUID, Row] = {}
    by_key: dict[str, Row] = {}
    skipped = [n for n in inserting if n.id not in inserted]
    if skipped:
        # a key stored before; or this very insert, committed before a lost connection
        # made the driver run it again
        found = yield Query("execution_by_keys_or_ids", {
            "keys": [n.idempotency_key for n in skipped if n.idempotency_key is not None],
            "ids": [n.id for n in skipped]})
        for r in found:
            by_id[r["id"]] = r
            if r["idempotency_key"] is not None:
                by_key[r["idempotency_key"]] = r
    answers: list[Submitted] = []
    conflicts: dict[int, uuid.UUID] = {}
    for i, new in enumerate(items):
        key = new.idempotency_key
        if key is not None and first[key] != i:  # a key earlier in the batch
            earlier = answers[first[key]]
            answer = Submitted(earlier.execution, False, earlier.request_digest)
        elif new.id in inserted:
            answer = Submitted(inserted[new.id], True, new.request_digest)
        elif new.id in by_id:
            answer = Submitted(execution_from(by_id[new.id]), True,
                               by_id[new.id]["request_digest"])
        elif key is not None and key in by_key:
            answer = Submitted(execution_from(by_key[key]), False,
                               by_key[key]["request_digest"])
        else:  # the row its key named was deleted (retention) since: the key is free
            raise ConflictVanished(new.idempotency_key)
        if not answer.created and answer.request_digest != new.request_digest:
            conflicts[i] = answer.execution.id
        answers.append(answer)
    if conflicts and all_or_nothing:
        raise BatchConflict(sorted(conflicts), conflicts)
    return answers
