"""The store protocols, one per consumer, and ``Store``, which every backend implements.

A component is typed against only what it may touch (as Obelisk splits its storage
traits): the workflow :class:`JournalStore` (a running workflow's fenced journal), the
:class:`WorkerStore` (claims, leases and the worker's fenced exits), the
:class:`ControlStore` (the API's and the CLI's requests), the :class:`MaintenanceStore`
(periodic services), :class:`ReadStore` (reads everyone may make) and :class:`TokenStore`
(the API tokens: kept by the CLI, checked by the API on every request).

Methods are named entity first (``execution_claim``, ``execution_complete_if_owned``).
Every state change is a single guarded statement whose WHERE clause names the states it
may leave (taken from :data:`veracity.core.states.TRANSITIONS`) plus its history event,
in one transaction. Zero rows changed is an answer (``TransitionResult.applied=False``),
never an exception. The conformance suite in ``tests/store/`` runs against every backend.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import Protocol

from veracity.core.requests import CallbackReport, InterruptKind, ResolveAction
from veracity.core.states import Status
from veracity.models import (
    JSON,
    Adopted,
    ApiToken,
    CallbackResult,
    Claim,
    ControlResult,
    CronDefinition,
    CronFire,
    CronRecord,
    DeploymentRecord,
    DeploymentSummary,
    Execution,
    ExecutionFilter,
    FoundToken,
    HistoryEvent,
    Interrupt,
    ListCursor,
    NewApiToken,
    NewExecution,
    PruneBatch,
    ReconcileAction,
    Recovered,
    Submitted,
    Taken,
    TransitionResult,
    WaitRecord,
    WorkerInfo,
    WorkerRecord,
)
from veracity.store._common import RunnerLock

__all__ = [
    "ControlStore",
    "DelegatedWrites",
    "JournalStore",
    "MaintenanceStore",
    "ReadStore",
    "Store",
    "TokenStore",
    "WorkerStore",
]


class ReadStore(Protocol):
    """Reads, for everyone."""

    backend: str
    """``"postgresql"`` or ``"sqlite"``."""

    async def ping(self) -> None:
        """Raise if the database does not answer."""

    async def retention_totals(self) -> dict[str, int]:
        """What retention and ``veracity prune`` deleted from this database since
        migration 0019, whichever process did: ``executions``, ``history`` (events) and
        ``messages`` (each batch adds its own in its transaction)."""

    async def check_session(self) -> None:
        """Raise :class:`veracity.errors.ConfigError` if the store's connections do not keep
        their sessions (PostgreSQL through a connection pooler in transaction mode:
        docs/scaling.md, "Connection poolers"); a server and a worker check at start.
        SQLite has nothing to check."""

    async def db_now(self) -> datetime:
        """The store's clock (the injected one, else the database's)."""

    async def execution_get(self, execution_id: uuid.UUID) -> Execution | None: ...

    async def execution_list(
        self, filter: ExecutionFilter, *, limit: int, after: ListCursor | None = None
    ) -> list[Execution]:
        """Newest first (created_at, id descending), keyset-paginated by ``after``."""

    async def history_list(
        self, execution_id: uuid.UUID, *, after_seq: int = 0, limit: int = 1000
    ) -> list[HistoryEvent]:
        """History events in order of ``seq``."""

    async def worker_list(self, *, limit: int = 1000) -> list[WorkerRecord]: ...

    async def execution_waits(self, ids: Sequence[uuid.UUID], *, shown_children: int = 5
                              ) -> dict[uuid.UUID, WaitRecord]:
        """For each id (an unknown one included): the data of its newest history event of
        each kind in :data:`veracity.models.WAIT_EVENT_KINDS`, and its unfinished
        children by join set (how many, and the ``shown_children`` oldest), in a fixed
        number of statements however many ids."""

    async def execution_flag_counts(self) -> dict[str, int]:
        """How many executions carry each flag kind (terminal forced ones included)."""

    async def execution_status_counts(self) -> dict[str, int]:
        """How many unfinished executions are in each unfinished status (a status with
        none is left out)."""

    async def execution_counts_in(self, statuses: Sequence[str]) -> dict[str, int]:
        """How many executions there are in each of ``statuses``, terminal ones included
        (a status with none is left out)."""

    async def execution_children_of(
        self, parent_ids: Sequence[uuid.UUID], *, limit: int
    ) -> list[Execution]:
        """Up to ``limit`` children of these executions, by parent, then oldest first
        (created_at, id)."""

    async def history_list_kinds(
        self, execution_id: uuid.UUID, kinds: Sequence[str], *, after_seq: int = 0,
        limit: int = 1000,
    ) -> list[HistoryEvent]:
        """History events of these kinds only, in order of ``seq``."""

    async def history_kind_counts(self, execution_id: uuid.UUID) -> dict[str, int]:
        """How many events of each kind the execution's history holds."""

    async def cron_records(self, names: Sequence[str]) -> dict[str, CronRecord]:
        """The recorded cron entries among ``names`` (one not yet run by any server is
        absent), each with its newest slot and that slot's execution and status."""

    async def deployment_get(self, deployment_id: str) -> DeploymentRecord | None:
        """The registry's record of a deployment (docs/deployments.md)."""

    async def deployment_list(self, *, live_within: timedelta) -> list[DeploymentSummary]:
        """Every deployment the registry knows, newest first (``first_seen``), then those
        that only unfinished executions carry (by id), each with its unfinished executions
        by status, its live workers (:func:`veracity.core.deployments.is_live`, each at
        most ``live_within`` after its last heartbeat) and how many of its executions are
        stranded (:mod:`veracity.core.deployments`)."""


    async def execution_ended_among(self, ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        """Which of ``ids`` are terminal (completed, failed, failed_transient, cancelled)."""

    def ended_signals(self, wake: Callable[[], None]
                      ) -> AbstractAsyncContextManager[Callable[[], bool]]:
        """While entered, ``wake()`` is called (on the event loop) soon after any
        transaction that ended executions commits: PostgreSQL's notifications (channel
        ``veracity_ended``: from every process); on SQLite, the commits of this process's
        stores on the same file (another process's are not seen). A hint: it may come
        without an end, and the caller checks. The context's value answers whether the
        signals still come (a lost notification connection answers False)."""


class DelegatedWrites(Protocol):
    """The writes decided by looks at delegated runs (the reconciler, an operator's
    resolve, a cancel, the worker's ambiguous trigger)."""

    async def execution_reconcile_apply(
        self, actions: Sequence[ReconcileAction]
    ) -> list[ReconcileAction]:
        """The writes decided by looks at delegated executions (ends once the engine
        confirmed, flags, cleared flags), in one transaction; returns those applied."""


class JournalStore(Protocol):
    """What a running workflow's Context touches: its journal, children, waits and
    messages, each write fenced by the claim (owner, epoch, unexpired lease)."""

    async def history_list(
        self, execution_id: uuid.UUID, *, after_seq: int = 0, limit: int = 1000
    ) -> list[HistoryEvent]:
        """History events in order of ``seq`` (a write whose answer was lost is looked
        for here before it is written again)."""

    async def execution_children(
        self, parent_id: uuid.UUID, join_set: str | None = None
    ) -> tuple[list[Execution], int]:
        """The parent's signal_seq (read first), and its children: ended ones first in the
        order they ended, then the unfinished ones."""

    async def execution_checkpoint_if_owned(
        self, claim: Claim, kind: str, data: JSON
    ) -> TransitionResult:
        """Append a journal event (``step_completed``, ...) to history, only while the
        lease is held; the status does not change. A refusal is recorded as a late report
        and answered ``applied=False``."""

    async def execution_block_if_owned(
        self,
        claim: Claim,
        *,
        wake_at: datetime | None,
        seen_signal: int,
        events: Sequence[tuple[str, JSON]],
        reason: str,
    ) -> TransitionResult:
        """running -> blocked (no lease, no worker), with the journal ``events`` that explain
        the wait; -> pending instead if the signal moved since ``seen_signal`` or the timer
        ``wake_at`` is already due. Refused (late report) without the lease."""

    async def execution_spawn_if_owned(
        self, claim: Claim, children: Sequence[NewExecution], events: Sequence[tuple[str, JSON]]
    ) -> TransitionResult:
        """Insert executions (children or top-level) and the parent's journal events in one
        fenced transaction. An id that exists already is not inserted again."""

    async def execution_take_message_if_owned(
        self, claim: Claim, topic: str, pos: int
    ) -> Taken:
        """Take the oldest unread message on ``topic`` and journal it at ``pos``."""


class WorkerStore(JournalStore, DelegatedWrites, ReadStore, Protocol):
    """What a worker touches: claims, leases and their renewal, its fenced exits from
    running, interrupts, timers, its registration, and the start of delegated runs."""

    supports_notifications: bool
    """True if :meth:`pending_notifications` delivers wake-ups (PostgreSQL LISTEN)."""

    supports_handoff: bool
    """True if submissions can be handed to idle workers' offers (PostgreSQL)."""

    async def execution_claim(
        self, owner: str, ffqns: Sequence[str], *, limit: int, lease_ttl: timedelta,
        deployment_id: str | None = None, upgrade_ffqns: Sequence[str] = (),
    ) -> list[Execution]:
        """Claim up to ``limit`` due pending executions of the given workflows, earliest
        first: set running, owner, a new lease_epoch and lease_expires_at from the store's
        clock. Concurrent claimers never receive the same execution.

        Only executions of ``deployment_id``, except for the workflows in
        ``upgrade_ffqns`` (a subset of ``ffqns``: registered with ``upgrade="auto"``),
        claimed from every deployment; every claimed execution belongs to
        ``deployment_id`` from then on, and its ``running`` event names it.
        ``deployment_id=None`` claims from every deployment (tools and tests)."""

    async def execution_complete_if_owned(self, claim: Claim, result: JSON) -> TransitionResult:
        """running -> completed, only while ``claim`` still holds an unexpired lease.
        A refused write is appended to history as a ``late_report``."""

    async def execution_fail_if_owned(
        self, claim: Claim, error: JSON, *, transient: bool = False
    ) -> TransitionResult:
        """running -> failed (or failed_transient), guarded like completion."""

    async def execution_retry_if_owned(self, claim: Claim, error: JSON, *, retry: int,
                                       of: int, delay: float) -> TransitionResult:
        """running -> pending, claimable again ``delay`` seconds later: the workflow failed
        with its own error and its retry policy allows retry number ``retry`` of ``of``.
        Its history event (``pending``, reason "workflow retry") starts a fresh journal:
        the next run replays nothing from before it. Guarded like completion."""

    async def execution_release_if_owned(self, claim: Claim, reason: str) -> TransitionResult:
        """running -> pending (the lease is given back), guarded like completion."""

    async def execution_complete_many_if_owned(
        self, owner: str, items: Sequence[tuple[Claim, JSON]]
    ) -> list[TransitionResult]:
        """Complete several executions of one owner at once; each row is guarded exactly
        like :meth:`execution_complete_if_owned` (refusals become late reports). Results
        are in the order of ``items``. An applied one carries ``exit`` (id, workflow,
        status, times as written) and no ``execution``: the worker, its one caller, needs
        no more, and reading each row back cost it and the database (docs/scaling.md); a
        refused one carries the current row, as a single completion's does."""

    async def execution_checkpoint_many_if_owned(
        self, owner: str, items: Sequence[tuple[Claim, str, JSON]]
    ) -> list[TransitionResult]:
        """Journal events of several executions of one owner at once (one commit), each
        guarded like :meth:`execution_checkpoint_if_owned`; results in order of ``items``.
        An execution that appears twice is refused the second time (late report)."""

    async def lease_renew(
        self, owner: str, leases: Sequence[Claim], ttl: timedelta
    ) -> list[Claim]:
        """The heartbeat: extend every still-valid lease of ``owner`` to now + ttl (one
        statement) and touch the worker's row and its deployment's last seen; return the
        leases renewed. A lease missing from the answer is lost."""

    async def execution_stop_if_owned(self, claim: Claim, kind: InterruptKind) -> TransitionResult:
        """Act on an interrupt at a step boundary: ``cancel`` (-> cancelled, or blocked while
        children that cannot be cancelled still run) or ``pause`` (-> paused)."""

    async def execution_interrupts(self, owner: str) -> list[Interrupt]:
        """Running executions of ``owner`` with a cancel or pause requested."""

    async def execution_wake_due(self, *, limit: int = 1000) -> list[Execution]:
        """Blocked executions whose timer is due become pending."""

    async def worker_register(self, info: WorkerInfo) -> WorkerRecord:
        """Register (or re-register) the worker, and record its deployment as seen: first
        seen now if new, else last seen now. Each :meth:`lease_renew` sees it again."""

    async def worker_stop(self, worker_id: str) -> None: ...

    def pending_notifications(self, handoff_to: str | None = None
                              ) -> AsyncIterator[Execution | None]:
        """Yield ``None`` once as soon as it listens (an execution that became pending
        before could not be heard: the caller looks for work now), then once per wake-up
        notification (an execution became pending); with ``handoff_to``, also each
        execution a submission handed to that worker (its offer, :meth:`offer_post`), as
        written: running, leased to it. Only when ``supports_notifications``; ends with an
        exception if the connection is lost."""

    async def offer_post(self, owner: str, *, deployment_id: str, ffqns: Sequence[str],
                         lease_ttl: timedelta, expires_in: timedelta) -> None:
        """Offer to take the next submission of one of ``ffqns`` in ``deployment_id``
        that is due now and not paused, as its claim with a ``lease_ttl`` lease, for
        ``expires_in`` (the worker's previous offer replaced). At most one submission
        takes an offer (docs/workers.md, "Hand-off to an idle worker"). Only when
        ``supports_handoff``."""

    async def offer_refresh(self, owner: str, *, expires_in: timedelta) -> bool:
        """Make the worker's offer last ``expires_in`` from now: True if it was still
        there; False if a submission took it (or there was none), and then no new one is
        made (post one with :meth:`offer_post` once that hand-off is heard)."""

    async def execution_leased_to(self, owner: str) -> list[Execution]:
        """The running executions whose unexpired lease ``owner`` holds, in id order."""

    async def offer_withdraw(self, owner: str) -> bool:
        """Withdraw the worker's offer: True if it was still there, False if there was
        none or a submission took it (that submission has committed by then, and its
        notification is on its way)."""

    def interrupt_notifications(self) -> AsyncIterator[uuid.UUID]:
        """Yield the id of each running execution asked to stop (PostgreSQL NOTIFY)."""

    async def execution_delegate_if_owned(
        self, claim: Claim, engine: str, callback_token_hash: str
    ) -> TransitionResult:
        """Before the trigger is sent: still running, now delegated to ``engine`` (no lease,
        no external id yet), the trigger time recorded."""

    async def execution_record_external_id(
        self, execution_id: uuid.UUID, external_id: str, *, actor: str = "worker",
        reason: str | None = None,
    ) -> ControlResult:
        """Attach the engine's id to a delegated execution that has none; refused (and kept
        as a late report) otherwise."""

    async def execution_end_external(
        self, execution_id: uuid.UUID, *, to: Status, expected_external_id: str | None,
        any_external_id: bool = False, result: JSON = None, error: JSON = None,
        event: dict[str, JSON] | None = None,
    ) -> ControlResult:
        """End a delegated execution if it is still running with the expected external id."""


class RetryWrites(Protocol):
    async def execution_retry(
        self, old_id: uuid.UUID, new: NewExecution, replayed: Sequence[tuple[str, JSON]],
        *, actor: str | None = None, reason: str | None = None,
    ) -> ControlResult:
        """An operator's retry of a failed (or failed_transient) execution: ``new``, pending
        and linked to it (``retry_of``), with the ``replayed`` journal events of the failed
        run copied into its history after its ``pending`` event (its run replays them);
        the failed one is left unchanged. Refused (wrong state) for any other status."""


class TokenStore(Protocol):
    """Scoped API tokens (docs/security.md): only their SHA-256 digests are stored. Rows
    are never deleted; a name is never given out twice."""

    async def token_create(self, new: NewApiToken) -> ApiToken | None:
        """Insert the token, created now by the store's clock and expiring ``expires_in``
        later (never if None). None, and nothing written, if the name exists already."""

    async def token_get(self, name: str) -> ApiToken | None: ...

    async def token_find(self, key_id: str) -> FoundToken | None:
        """The token with this key id (the public part of a token), with the store's time."""

    async def token_list(self) -> list[ApiToken]:
        """Every token, revoked and expired ones too, oldest first (created_at, name)."""

    async def token_revoke(self, name: str) -> ApiToken | None:
        """Set revoked_at to now on a token not revoked yet; None if there is no such
        token or it was revoked already (nothing changes then)."""

    async def token_touch(self, key_id: str) -> None:
        """Record that the token was accepted now (last_used_at only moves forward)."""


class ControlStore(TokenStore, RetryWrites, DelegatedWrites, ReadStore, Protocol):
    """The control plane's requests (the HTTP API and the CLI), API tokens included."""

    async def execution_submit(self, new: NewExecution) -> Submitted:
        """Insert a pending execution and its ``pending`` history event.

        With an idempotency key that already exists, insert nothing and return the
        existing execution with ``created=False`` (concurrent calls create one row).
        """

    async def execution_submit_many(self, items: Sequence[NewExecution], *,
                                    all_or_nothing: bool = True) -> list[Submitted]:
        """Submit a batch in one transaction: each item as :meth:`execution_submit` would,
        answered in the order of ``items``. An item whose idempotency key appeared earlier
        in the batch is answered the execution of that earlier item (``created=False``, its
        digest). If any keyed item's ``request_digest`` differs from the one its key
        already names (stored, or earlier in the batch), nothing is written and
        :class:`~veracity.models.BatchConflict` names those items.

        Not ``all_or_nothing``: the items are independent submissions that share a
        transaction (:mod:`veracity.grouping`). A key reused with a different request
        refuses nothing; that item is answered as :meth:`execution_submit` answers it (the
        execution its key names, ``created=False``, that execution's digest, which the
        caller compares) and the other items are written."""

    async def execution_cancel(
        self, execution_id: uuid.UUID, *, actor: str | None = None, reason: str | None = None
    ) -> ControlResult:
        """Request cancellation of the execution and, recursively, of its unfinished
        -cancellable children; record cancelled at once what is not running and has no
        unfinished children. A terminal execution is left unchanged."""

    async def execution_cancel_many(
        self, ids: Sequence[uuid.UUID], *, actor: str | None = None, reason: str | None = None
    ) -> list[ControlResult]:
        """Cancel each execution as :meth:`execution_cancel` would, all in one transaction,
        answered in the order of ``ids``: ``execution`` None for an unknown id; refused with
        code ``not_cancellable`` (and nothing changed) for an unfinished execution whose
        name does not end in -cancellable; a terminal one unchanged."""

    async def execution_pause(
        self, execution_id: uuid.UUID, *, actor: str | None = None, reason: str | None = None
    ) -> ControlResult:
        """Hold it (docs/workflows.md); ``actor`` and ``reason`` go into its ``paused`` or
        ``pause_requested`` event (``by``, and ``reason`` when given)."""

    async def execution_unpause(
        self, execution_id: uuid.UUID, *, actor: str | None = None, reason: str | None = None
    ) -> ControlResult: ...

    async def message_send(
        self, execution_id: uuid.UUID, topic: str, payload: JSON, *,
        actor: str | None = None, reason: str | None = None,
    ) -> ControlResult:
        """Store a message durably and wake the execution if it is blocked; refused for a
        terminal execution. ``actor`` and ``reason``, when given, are recorded in its
        ``message_arrived`` event (an operator's reason, given on cancel, pause and
        unpause too, goes into the event those record)."""

    async def execution_callback(
        self, execution_id: uuid.UUID, token: str, report: CallbackReport, payload: JSON, *,
        transient: bool = False,
    ) -> CallbackResult:
        """An engine's /complete (report "complete") or /fail (report "fail")."""

    async def execution_resolve(
        self, execution_id: uuid.UUID, *, action: ResolveAction, external_id: str | None,
        reason: str, actor: str, expected_external_id: str | None = None,
        unconfirmed: str | None = None,
    ) -> ControlResult:
        """An operator, with a written reason: attach an external id; or ask to end the run
        (fail -> failed_transient, cancel -> cancelled), recorded until a look finds the
        engine run finished; or, with ``unconfirmed`` (why the engine could not confirm),
        end it now and keep it flagged as forced. Ends apply only while the external id is
        ``expected_external_id``."""

    async def deployment_adopt(
        self, from_id: str, to_id: str, *, ffqn_prefix: str | None, actor: str,
        live_within: timedelta,
    ) -> Adopted:
        """Move the unfinished executions of ``from_id`` (whose workflow name starts with
        ``ffqn_prefix``, if given) onto ``to_id`` in one transaction, each with an
        ``adopted`` history event ``{from, to, by}``. Refused, with nothing written, when
        ``from_id`` is unknown (``not_found``: neither recorded nor carried by an unfinished
        execution), ``to_id`` was never recorded (``unknown_target``), or ``from_id`` has a
        live worker (``deployment_live``). ``from_id == to_id`` is a ValueError."""


class MaintenanceStore(DelegatedWrites, ReadStore, Protocol):
    """The periodic services: single-runner locks, lease recovery, the reconciler, cron."""

    async def deployment_seen(self, deployment_id: str) -> DeploymentRecord:
        """A server of ``deployment_id`` runs: record it (first seen now if new, else last
        seen now)."""

    def single_runner(self, name: str) -> AbstractAsyncContextManager[RunnerLock]:
        """Try to take the lock ``name`` for one tick of a periodic service; yields a
        RunnerLock, truthy if it was taken (never waits), whose ``held()`` tells whether it
        still is. PostgreSQL: a session advisory lock on a dedicated
        connection, released in ``finally``, the connection discarded if unlocking fails;
        the holder pings that session while the tick runs and the server ends it once
        silent for ``lock_silence`` (a holder frozen mid-tick loses the lock). SQLite: an
        exclusive flock on a file beside the database."""

    async def execution_recover_expired(
        self, *, max_attempts: int, limit: int = 1000
    ) -> list[Recovered]:
        """Move executions whose lease expired back to pending (attempt + 1), or to
        failed_transient once ``attempt >= max_attempts``; clear the owner; record why.
        Executions delegated to an external engine hold no lease and are never touched."""

    async def worker_running_on(self, host_key: str) -> list[WorkerRecord]:
        """The registered workers with this host key not marked stopped."""

    async def worker_gone(self, host_key: str, workers: Sequence[tuple[str, int]]) -> int:
        """Workers (id, pid) whose process was found gone from the host ``host_key``
        (docs/workers.md): each is marked stopped and the leases it holds end now, only
        while the registry still names that process on that host; answers how many leases
        ended. Lease recovery then takes their executions as it takes any expired lease."""

    async def execution_external_running(
        self, *, limit: int = 1000, after: uuid.UUID | None = None
    ) -> list[Execution]:
        """Running executions delegated to an engine, by id (keyset ``after``)."""

    async def execution_prune(
        self, *, cutoff: datetime, limit: int = 500,
        after: tuple[datetime, uuid.UUID] | None = None, dry_run: bool = False,
        rest: Sequence[uuid.UUID] = (),
    ) -> PruneBatch:
        """One retention batch (docs/operations.md, Retention): the next ``limit``
        top-level executions that ended before ``cutoff``, oldest end first, after the
        cursor ``after``, each with everything below it; a family all of whose members
        ended before the cutoff, none the latest slot of a cron entry nor retried by an
        execution that stays (veracity.core.retention), is deleted with its history,
        messages and cron slots in one transaction. ``dry_run`` counts and deletes
        nothing. Never a non-terminal execution. A family larger than ``limit`` goes a
        part at a time: the batch that reads it deletes its first part and answers the
        rest of its order (``PruneBatch.rest``); given back as ``rest``, the next batch
        deletes the next part of it without reading the family again (each checked
        under its lock), and once it is empty, reads the family again from ``after``."""

    async def execution_prune_count(self, *, cutoff: datetime) -> int:
        """How many top-level executions ended before ``cutoff``: the roots a retention
        pass reads (some may be kept)."""

    async def cron_register(
        self, definitions: Sequence[CronDefinition]
    ) -> dict[str, CronRecord]:
        """Record the cron entries a server runs: an entry new to the database, or recorded
        with another schedule or time zone, is first seen now; the others are left as
        they are. Returns their records."""

    async def cron_fire(self, fires: Sequence[CronFire]) -> list[CronFire]:
        """Start slots, in one transaction: for each slot whose key (name, slot time) is
        still free, the slot, its pending execution and that execution's ``pending``
        event. A slot another caller started first is left alone (concurrent callers
        start each slot once). Returns the slots this call started, in key order."""


class Store(WorkerStore, ControlStore, MaintenanceStore, Protocol):
    """A whole backend: every consumer's protocol, and the schema."""

    async def migrate(self) -> list[int]:
        """Apply pending migrations (safe from several processes at once); return the
        versions this call applied."""

    async def close(self) -> None: ...

