"""The records Veracity stores and returns (plain dataclasses, no I/O)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from veracity._frozen import quick_init
from veracity.core.reconcile import FlagKind, WriteKind
from veracity.core.recovery import RecoveryAction
from veracity.core.requests import CallbackOutcome, InterruptKind
from veracity.core.states import Status

JSON = Any  # a value that json.dumps accepts


@quick_init  # a faster __init__ (veracity/_frozen.py): one or more per execution
@dataclass(frozen=True, slots=True)
class Execution:
    id: uuid.UUID
    ffqn: str
    params: list[JSON]
    status: Status
    result: JSON
    error: JSON
    attempt: int
    deployment_id: str
    parent_id: uuid.UUID | None
    idempotency_key: str | None
    scheduled_at: datetime
    created_at: datetime
    updated_at: datetime
    lease_owner: str | None
    lease_epoch: int
    lease_expires_at: datetime | None
    history_seq: int = 0
    """Number of history events so far (the seq of the newest one)."""
    join_set: str | None = None
    """For a child execution: the parent's join set it belongs to."""
    wake_at: datetime | None = None
    """For a blocked execution waiting on a timer: when it becomes pending."""
    signal_seq: int = 0
    """Moves on every event a blocked execution may wait for (a child ended, a message)."""
    paused_from: str | None = None
    cancel_requested_at: datetime | None = None
    pause_requested_at: datetime | None = None
    engine: str | None = None
    """For an execution delegated to an external engine: the engine's configured name."""
    external_execution_id: str | None = None
    triggered_at: datetime | None = None
    """Veracity's own record of when it sent the trigger (limits are measured from it)."""
    callback_token_hash: str | None = None
    flagged_at: datetime | None = None
    flag_reason: str | None = None
    flag_kind: str | None = None
    """Why it is flagged (a :class:`veracity.core.reconcile.FlagKind` value)."""
    end_request: JSON = None
    """An operator's request to end a delegated run, waiting for the engine to confirm
    the stop: ``{"action": "fail"|"cancel", "reason", "by"}``."""
    end_requested_at: datetime | None = None
    retry_of: uuid.UUID | None = None
    """For an execution made by an operator's retry: the failed execution it retries."""
    started_at: datetime | None = None
    """When a worker first claimed it (kept across later claims); None if it never ran."""


@quick_init  # a faster __init__ (veracity/_frozen.py): one or more per execution
@dataclass(frozen=True, slots=True)
class HistoryEvent:
    execution_id: uuid.UUID
    seq: int
    kind: str
    at: datetime
    data: JSON


@quick_init  # a faster __init__ (veracity/_frozen.py): one or more per execution
@dataclass(frozen=True, slots=True)
class NewExecution:
    """What a submission asks for. ``scheduled_at=None`` means "now" (database clock)."""

    ffqn: str
    params: list[JSON]
    deployment_id: str
    id: uuid.UUID
    idempotency_key: str | None = None
    request_digest: str | None = None
    scheduled_at: datetime | None = None
    parent_id: uuid.UUID | None = None
    join_set: str | None = None
    paused: bool = False
    """Submit on hold: status ``paused`` (returns to pending when unpaused)."""
    retry_of: uuid.UUID | None = None


@quick_init  # a faster __init__ (veracity/_frozen.py): one or more per execution
@dataclass(frozen=True, slots=True)
class Submitted:
    execution: Execution
    created: bool
    """False when an execution with the same idempotency key already existed."""
    request_digest: str | None
    """The digest stored with the existing execution (to detect a different body)."""


class BatchConflict(Exception):
    """A batch submission refused whole, nothing written: the items at ``indexes`` reuse an
    idempotency key with a different request (``existing``: the execution each key names,
    by index)."""

    def __init__(self, indexes: list[int], existing: dict[int, uuid.UUID]) -> None:
        super().__init__(f"idempotency keys reused with a different request at {indexes}")
        self.indexes = indexes
        self.existing = existing


@dataclass(frozen=True, slots=True)
class ListCursor:
    """Keyset position: the (created_at, id) of the last row of the previous page."""

    created_at: datetime
    id: uuid.UUID


@dataclass(frozen=True, slots=True)
class ExecutionFilter:
    statuses: tuple[Status, ...] = ()
    ffqn_prefix: str | None = None
    deployment_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    flagged: bool | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """The lease a worker holds on a claimed execution (its fencing token)."""

    execution_id: uuid.UUID
    owner: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Exit:
    """What a batched exit from running wrote (the worker's completions, applied), as the
    database answered: the execution's id, workflow, new status and times, without the
    rest of its row read back."""

    id: uuid.UUID
    ffqn: str
    status: Status
    started_at: datetime | None
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class TransitionResult:
    """The outcome of a guarded state change.

    ``applied`` is False when the guard refused it (someone else won, or the execution was
    in a state the table does not allow to leave that way); ``execution`` is then the
    current row, or None if the id does not exist. A batch of completions answers an
    applied one with ``exit`` and no ``execution`` (``Store.execution_complete_many_if_owned``).
    """

    applied: bool
    execution: Execution | None
    reason: str | None = None
    exit: Exit | None = None


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    ttl: timedelta = field(default=timedelta(seconds=120))


WAIT_EVENT_KINDS = ("blocked", "paused", "pause_requested")
"""The history events that say what an unfinished execution waits for, and who paused it."""


@dataclass(frozen=True, slots=True)
class WaitRecord:
    """What the history and the children of one execution say about its wait (for its
    ``waiting_reason``: :mod:`veracity.core.waiting`)."""

    events: dict[str, JSON] = field(default_factory=dict)
    """The data of its newest event of each kind in :data:`WAIT_EVENT_KINDS` it has."""
    children: dict[str | None, tuple[int, list[uuid.UUID]]] = field(default_factory=dict)
    """Its unfinished children by join set: how many, and the oldest few of them."""


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker says about itself when it registers."""

    id: str
    host: str
    pid: int
    deployment_id: str
    ffqns: list[str]
    concurrency: int
    upgrade_ffqns: list[str] = field(default_factory=list)
    """The workflows of ``ffqns`` it claims from every deployment (registered with
    ``upgrade="auto"``); the others only from its own deployment."""
    heartbeat_interval: float | None = None
    """Seconds between its heartbeats: it is not live once a beat is late by more than
    two intervals (:func:`veracity.core.deployments.is_live`)."""
    host_key: str | None = None
    """The host and process namespace it runs in (:func:`veracity.host.host_key`), so
    that a process beside it can tell when it is gone; None when unknown."""


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    id: str
    host: str
    pid: int
    deployment_id: str
    ffqns: list[str]
    concurrency: int
    started_at: datetime
    last_heartbeat: datetime
    stopped_at: datetime | None
    upgrade_ffqns: list[str] = field(default_factory=list)
    heartbeat_interval: float | None = None
    """Seconds between its heartbeats; None for a worker that did not record it."""
    host_key: str | None = None
    """The host and process namespace it runs in; None when unknown."""


@dataclass(frozen=True, slots=True)
class DeploymentRecord:
    """A deployment as the registry knows it: when a server or worker of it first
    started, and when one was last seen running (docs/deployments.md)."""

    id: str
    first_seen: datetime
    last_seen: datetime


@dataclass(frozen=True, slots=True)
class DeploymentSummary:
    """One row of the deployments listing."""

    id: str
    first_seen: datetime | None
    """None for a deployment no server or worker recorded (only executions carry it)."""
    last_seen: datetime | None
    unfinished: dict[str, int]
    """Unfinished executions by status: every unfinished status, 0 included."""
    live_workers: int
    stranded: int
    """Unfinished executions no live worker will run (docs/deployments.md)."""


@dataclass(frozen=True, slots=True)
class Adopted:
    """What an adopt did: the executions moved (in id order), or why nothing was."""

    execution_ids: list[uuid.UUID]
    refused: str | None = None
    code: str = "wrong_state"
    """The error code of a refusal: ``not_found`` (an unknown deployment),
    ``deployment_live`` or ``unknown_target``."""


@dataclass(frozen=True, slots=True)
class NewApiToken:
    """A token to store: its digest, never the token itself (docs/security.md)."""

    name: str
    key_id: str
    token_hash: str
    scopes: tuple[str, ...]
    expires_in: timedelta | None
    """From the store's clock at creation; None: it never expires."""


@dataclass(frozen=True, slots=True)
class ApiToken:
    name: str
    key_id: str
    token_hash: str
    scopes: tuple[str, ...]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


@dataclass(frozen=True, slots=True)
class FoundToken:
    """A token found by its key id, and the store's time when it was read (expiry is
    judged by the store's clock, as everything else is)."""

    token: ApiToken
    now: datetime


@dataclass(frozen=True, slots=True)
class Recovered:
    """What one recovery pass did to one execution whose lease had expired."""

    execution: Execution
    previous_owner: str
    previous_epoch: int
    action: RecoveryAction


@dataclass(frozen=True, slots=True)
class PruneBatch:
    """What one retention batch read, deleted (or, in a dry run, would delete) and kept
    (docs/operations.md, Retention)."""

    roots: int
    """top-level executions whose families this batch dealt with (deleted or kept)"""
    cursor: tuple[datetime, uuid.UUID] | None
    """where the next batch starts (the last root dealt with); None when none was read"""
    executions: int = 0
    history: int = 0
    messages: int = 0
    kept: dict[str, int] = field(default_factory=dict)
    """families kept, by reason (veracity.core.retention.KeepReason)"""
    more: bool = False
    """more may be left after the cursor: the pass goes on"""
    partial: bool = False
    """a part of one family too large for a batch went (its deepest members); the
    cursor stays where it was, on that family's root"""
    rest: tuple[uuid.UUID, ...] = ()
    """that family's members still to go before its last part, in order: the next
    batch's ``rest`` (``execution_prune``)"""


@dataclass(frozen=True, slots=True)
class Message:
    id: int
    execution_id: uuid.UUID
    topic: str
    payload: JSON
    created_at: datetime
    consumed_at: datetime | None = None
    consumed_pos: int | None = None


@dataclass(frozen=True, slots=True)
class ControlResult:
    """The outcome of an operator's request (cancel, pause, unpause, message).

    ``execution`` is None when the id does not exist. ``changed`` is False when the request
    changed nothing (already in that state, or terminal). ``refused`` names why a request
    does not apply to the current state (answered 409).
    """

    execution: Execution | None
    changed: bool = False
    refused: str | None = None
    message: Message | None = None
    code: str = "wrong_state"
    """The error code of a refusal (``wrong_state``, ``not_pausable``)."""


@dataclass(frozen=True, slots=True)
class Interrupt:
    """A running execution whose owner must stop it: ``kind`` is cancel or pause."""

    claim: Claim
    kind: InterruptKind


@dataclass(frozen=True, slots=True)
class Taken:
    """What a worker's attempt to take a message found."""

    applied: bool
    """False when the lease was lost (the attempt is kept as a late report)."""
    message: Message | None
    signal_seq: int
    """The execution's signal when it looked: block with it to not miss a later one."""


@dataclass(frozen=True, slots=True)
class CallbackResult:
    """What a /complete or /fail callback did: ``outcome`` is applied, repeat (the same
    report again: nothing changes), conflict (the execution ended otherwise: kept as a late
    report), unauthorized (wrong token: nothing changes) or not_found."""

    outcome: CallbackOutcome
    execution: Execution | None


@dataclass(frozen=True, slots=True)
class ReconcileAction:
    """One write decided after a look at a delegated execution: end it (``to``), flag it
    (``flag``) or clear its flag. It applies only if the execution is still running,
    delegated, with ``external_execution_id``."""

    execution_id: uuid.UUID
    external_execution_id: str | None
    kind: WriteKind
    reason: str
    data: dict[str, Any] = field(default_factory=dict)
    to: Status = Status.FAILED_TRANSIENT
    """For ``terminate``: ``failed_transient`` or ``cancelled``."""
    flag: FlagKind | None = None
    """For ``flag``: why (required)."""
    error: JSON = None
    """For ``terminate`` as ``failed_transient``: the error recorded (default: the
    reconciler's reason)."""

    def __post_init__(self) -> None:
        if self.kind is WriteKind.FLAG and self.flag is None:
            raise ValueError("a flag needs its kind")
        if self.kind is WriteKind.TERMINATE and self.to not in (
            Status.FAILED_TRANSIENT, Status.CANCELLED
        ):
            raise ValueError(f"a delegated run is never ended {self.to} without its engine")


@dataclass(frozen=True, slots=True)
class CronDefinition:
    """What the database records of a ``[[cron]]`` entry: a changed schedule or time zone
    counts as a new entry, first seen when a server first runs it (docs/cron.md)."""

    name: str
    schedule: str
    timezone: str


@dataclass(frozen=True, slots=True)
class CronRecord:
    """One cron entry in the database: when it was first seen (with this schedule and time
    zone), its newest slot, the execution that slot started and that execution's status."""

    name: str
    schedule: str
    timezone: str
    first_seen_at: datetime
    last_slot_at: datetime | None = None
    last_execution_id: uuid.UUID | None = None
    last_status: Status | None = None


@dataclass(frozen=True, slots=True)
class CronFire:
    """A slot to start: the slot's key (``name``, ``slot_at``) and the execution it starts,
    whose ``pending`` event carries ``event`` under ``"cron"``."""

    name: str
    slot_at: datetime
    execution: NewExecution
    event: dict[str, JSON] = field(default_factory=dict)
