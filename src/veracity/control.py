"""The control plane's use cases, shared by the HTTP API and the CLI: executions
(:class:`ExecutionService`) and API tokens (:class:`TokenService`).

Input is checked completely before anything is written, so bad input changes nothing.
"""

from __future__ import annotations

import base64
import binascii
import collections
import functools
import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from veracity._ids import new_execution_id, new_execution_ids, parse_execution_id
from veracity.core.cron import CronEntry
from veracity.core.deployments import Coverage, LiveWorker, is_live
from veracity.core.ffqn import (
    CANCELLABLE_SUFFIX,
    InvalidFfqn,
    is_cancellable,
    validate_ffqn,
    validate_ffqn_prefix,
)
from veracity.core.params import ParamsShape
from veracity.core.reconcile import FlagKind, WriteKind
from veracity.core.requests import CallbackOutcome, CallbackReport, ResolveAction
from veracity.core.states import Status
from veracity.core.tokens import (
    InvalidTokenRequest,
    Scope,
    TokenState,
    allows,
    check_name,
    key_id_of,
    matches,
    new_secret,
    parse_expires,
    parse_scopes,
    state,
)
from veracity.core.waiting import SHOWN_CHILDREN, Children, Facts, Holder, waiting_reason
from veracity.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    VeracityError,
)
from veracity.grouping import SubmitGroups
from veracity.models import (
    JSON,
    ApiToken,
    BatchConflict,
    ControlResult,
    CronRecord,
    DeploymentSummary,
    Execution,
    ExecutionFilter,
    HistoryEvent,
    ListCursor,
    Message,
    NewApiToken,
    NewExecution,
    WaitRecord,
    WorkerRecord,
)
from veracity.store.protocol import ControlStore
from veracity.telemetry import Telemetry
from veracity.waiting import EndWaits

if TYPE_CHECKING:
    from veracity.adapters.looks import Look, Looker
from veracity.worker.journal import retry_replay

log = logging.getLogger("veracity.control")

MAX_LIST_LIMIT = 1000
MAX_HISTORY_LIMIT = 10_000
MAX_IDEMPOTENCY_KEY = 256
MAX_JSON_DEPTH = 128
MAX_TOPIC_LENGTH = 256
MAX_DEPLOYMENT_ID = 128
MAX_ACTOR = 200
MAX_REASON = 2000
MAX_WORKERS_READ = 1000
"""Workers read for waiting reasons (the newest ones; a lease holder older than these is
told as not registered)."""
MAX_BATCH = 1000
"""Submissions one batch may carry (POST /v1/executions/batch)."""
MAX_WAIT = 60.0
"""Seconds one wait for an execution's end may last (GET ...?wait=)."""
# PostgreSQL's timestamptz ends at 294276 AD; keep far from both ends of every backend
MIN_TIME = datetime(1970, 1, 1, tzinfo=UTC)
MAX_TIME = datetime(9999, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Page:
    items: list[Execution]
    next_cursor: str | None
    waiting: dict[uuid.UUID, str] = field(default_factory=dict)
    """For each unfinished execution: why it is not finished yet (core.waiting)."""


@dataclass(frozen=True, slots=True)
class Resolved:
    """What an operator's resolve did: ``outcome`` is ``attached``, ``ended`` (the
    engine confirmed the run finished), ``stop_requested`` (the engine accepted the stop
    and has not confirmed yet: still running), ``forced`` (ended without the engine's
    confirmation, on request) or ``unconfirmed`` (ended on the operator's word: there
    was no external id to ask the engine about)."""

    execution: Execution
    changed: bool
    outcome: str
    message: str

    @property
    def unconfirmed(self) -> bool:
        """Ended without the engine's confirmation: the run may still be going there."""
        return self.outcome in ("forced", "unconfirmed")


class ServiceMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.resolutions = Counter(
            "veracity_resolutions", "Operator resolutions of delegated runs, by outcome "
            "(forced and unconfirmed: ended without the engine's confirmation)",
            ["action", "outcome"], registry=registry)
        self.flagged = Gauge(
            "veracity_flagged_executions", "Executions on the flagged list, by flag kind "
            "(forced: ended by an operator without the engine's confirmation)",
            ["kind"], registry=registry)
        for kind in FlagKind:
            self.flagged.labels(str(kind))

        self.pruned = DatabaseTotals(
            "veracity_pruned", "Rows retention and `veracity prune` deleted from this "
            "database, whichever process did (read from the database at each scrape: every "
            "server serves the same totals)", "kind", ("executions", "history", "messages"))
        (registry if registry is not None else REGISTRY).register(self.pruned)

    def flagged_children(self) -> list[tuple[str, Gauge]]:
        return [(str(kind), self.flagged.labels(str(kind))) for kind in FlagKind]


class DatabaseTotals(Collector):
    """A counter whose values are totals kept in the database (set before each scrape):
    the same for every process that serves it, and kept across restarts."""

    def __init__(self, name: str, documentation: str, label: str,
                 values: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.label = label
        self.values: dict[str, int] = dict.fromkeys(values, 0)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, total in self.values.items():
            family.add_metric([value], total)
        yield family


@dataclass(frozen=True, slots=True)
class WorkerView:
    record: WorkerRecord
    live: bool


@dataclass(frozen=True, slots=True)
class CronView:
    """A ``[[cron]]`` entry as configured here, with what the database records of it."""

    entry: CronEntry
    record: CronRecord | None
    """None until a server has run the entry."""
    next_slot: datetime | None
    """The first slot after now (database clock); None if it never fires again."""


@dataclass(frozen=True, slots=True)
class DeploymentView:
    summary: DeploymentSummary
    current: bool
    """The deployment of the process answering (its configured or digest id)."""


@dataclass(frozen=True, slots=True)
class AdoptOutcome:
    """What ``adopt`` did: the executions moved from ``from_id`` onto ``to_id``."""

    from_id: str
    to_id: str
    execution_ids: list[uuid.UUID]


@dataclass(frozen=True, slots=True)
class SubmitItem:
    """One submission of a batch (:meth:`ExecutionService.submit_many`)."""

    ffqn: str
    params: Sequence[JSON] = ()
    idempotency_key: str | None = None
    scheduled_at: datetime | None = None
    paused: bool = False


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)


def canonical_json(value: JSON) -> str:
    """JSON with sorted keys, no spaces, text as it is (json.dumps with those options: one
    encoder made once, as a batch makes 1,000 of these)."""
    return _CANONICAL.encode(value)


@functools.lru_cache(maxsize=256)
def _json_text(ffqn: str) -> str:
    return json.dumps(ffqn, ensure_ascii=False)


def request_digest(
    ffqn: str, params: list[JSON], scheduled_at: datetime | None, paused: bool = False
) -> str:
    """The digest of a submission's request, stored with an idempotency key: a SHA-256 of
    the canonical JSON of ``{ffqn, params, scheduled_at}`` (and ``paused`` only when set,
    so that digests of earlier requests stay the same)."""
    return digest_of(ffqn, canonical_json(params), scheduled_at, paused)


def digest_of(ffqn: str, params_json: str, scheduled_at: datetime | None,
              paused: bool = False) -> str:
    """:func:`request_digest` from the params' canonical JSON, already made: the
    canonical JSON of the whole body is written out (keys in sorted order) instead of
    encoding the params again."""
    when = json.dumps(scheduled_at.astimezone(UTC).isoformat()) if scheduled_at else "null"
    held = ',"paused":true' if paused else ""
    text = (f'{{"ffqn":{_json_text(ffqn)},"params":{params_json}'
            f'{held},"scheduled_at":{when}}}')
    return hashlib.sha256(text.encode()).hexdigest()


def encode_cursor(execution: Execution) -> str:
    raw = json.dumps([execution.created_at.isoformat(), str(execution.id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> ListCursor:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        at, ident = json.loads(base64.urlsafe_b64decode(padded.encode()))
        created_at = datetime.fromisoformat(at)
        if created_at.tzinfo is None:
            raise ValueError("naive time")
        return ListCursor(created_at=created_at, id=uuid.UUID(ident))
    except (ValueError, TypeError, AttributeError, binascii.Error, UnicodeDecodeError):
        raise BadRequest(
            "cursor is not one this server gave out; pass next_cursor unchanged",
            code="invalid_cursor",
        ) from None


def parse_id(text: str) -> uuid.UUID:
    try:
        return parse_execution_id(text)
    except ValueError:
        raise BadRequest(
            f"{text[:80]!r} is not an execution id (a UUID)", code="invalid_id"
        ) from None


def check_time(name: str, value: datetime | None) -> None:
    if value is None:
        return
    if value.tzinfo is None:
        raise InvalidInput(f"{name} must include a timezone (e.g. 2030-01-01T00:00:00Z)",
                           code="invalid_time")
    if not MIN_TIME <= value <= MAX_TIME:
        raise InvalidInput(f"{name} must be between 1970 and 9999", code="invalid_time")


def check_depth(what: str, value: JSON) -> None:
    """Refuse JSON nested deeper than MAX_JSON_DEPTH (it could be stored, but not served)."""
    stack: list[tuple[JSON, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise InvalidInput(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels",
                                   code="invalid_json")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


class InvalidBatch(InvalidInput):
    """A batch with bad items: each listed by index with its own code and message."""

    def __init__(self, bad: list[dict[str, object]]) -> None:
        first = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        super().__init__(
            f"{len(bad)} bad item(s) in the batch, at {', '.join(str(b['index']) for b in bad)}; "
            f"nothing was submitted. Item {first['index']}: {first['message']}{more}",
            code="invalid_batch", items=bad)


class ExecutionService:
    def __init__(
        self,
        store: ControlStore,
        *,
        workflows: Collection[str],
        deployment_id: str,
        max_payload_bytes: int = 1_048_576,
        live_within: timedelta = timedelta(seconds=120),
        on_submitted: Callable[[], None] | None = None,
        on_interrupt: Callable[[uuid.UUID], None] | None = None,
        looker: Looker | None = None,
        metrics: ServiceMetrics | None = None,
        crons: Sequence[CronEntry] = (),
        recovery_interval: timedelta = timedelta(seconds=30),
        max_attempts: int = 5,
        shapes: Mapping[str, ParamsShape] | None = None,
    ) -> None:
        self.recovery_interval = recovery_interval
        """How often lease recovery runs (``recovery.interval``): for waiting reasons."""
        self.max_attempts = max_attempts
        """Lease recovery's ``recovery.max_attempts``: for waiting reasons."""
        self.looker = looker
        """Takes looks at delegated runs (resolve, cancel); None: no engine is configured
        here, and a delegated run's engine cannot be asked."""
        self.shapes = dict(shapes or {})
        """The parameters each workflow of the app takes: params are checked against
        them at submission (a workflow without one, e.g. an external one, is not)."""
        self.metrics = metrics
        self.telemetry: Telemetry | None = None
        """Where this process counts what it does (docs/operations.md, Metrics)."""
        self.store = store
        self.workflows = workflows
        self.deployment_id = deployment_id
        self.max_payload_bytes = max_payload_bytes
        self.live_within = live_within
        self.on_submitted = on_submitted
        self.on_interrupt = on_interrupt
        """Told when a running execution was asked to cancel or pause (an in-process worker
        acts at its next step instead of at its next heartbeat)."""
        self.cron_entries = list(crons)
        """The configuration's ``[[cron]]`` entries (docs/cron.md)."""
        self._waits: EndWaits | None = None
        self.groups = SubmitGroups(store, writers=2, written=self._written)
        """Single submissions that arrive together share a transaction (veracity/grouping.py)."""

    def _written(self, count: int) -> None:
        if self.telemetry is not None:
            self.telemetry.submissions_written(count)

    def _check_workflow(self, ffqn: str) -> None:
        try:
            validate_ffqn(ffqn)
        except InvalidFfqn as exc:
            raise InvalidInput(str(exc), code="invalid_ffqn") from None
        if ffqn not in self.workflows:
            known = ", ".join(sorted(self.workflows)[:10]) or "none are registered"
            raise InvalidInput(
                f"unknown workflow {ffqn!r} (known: {known})", code="unknown_workflow"
            )

    def _check_payload(self, what: str, value: JSON) -> str:
        """Check a JSON value (depth, size, what JSON can carry); its canonical JSON."""
        try:
            text = canonical_json(value)
            size = len(text.encode())  # and a lone surrogate is refused here
        except RecursionError:
            raise InvalidInput(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels",
                               code="invalid_json") from None
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"{what} is not JSON: {exc}", code="invalid_json") from None
        if len(text) > MAX_JSON_DEPTH:  # shorter, it cannot nest that deep
            check_depth(what, value)
        if size > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"{what} is {size} bytes; the limit is {self.max_payload_bytes}"
            )
        return text

    def _check_params(self, ffqn: str, params: Sequence[JSON]) -> None:
        shape = self.shapes.get(ffqn)
        problem = shape.problem(params) if shape is not None else None
        if problem is not None:
            raise InvalidInput(f"params do not fit workflow {ffqn}: {problem}",
                               code="invalid_params")

    def _new(self, item: SubmitItem, ident: uuid.UUID | None = None,
             known: set[str] | None = None) -> NewExecution:
        """Check one submission whole (bad input raises, naming what is wrong) and build
        the execution to insert (with id ``ident``, or a new one). ``known``: workflow
        names checked already (a batch checks each name once)."""
        if known is None or item.ffqn not in known:
            self._check_workflow(item.ffqn)
            if known is not None:
                known.add(item.ffqn)
        params = item.params
        if isinstance(params, str | bytes) or not isinstance(params, Sequence):
            raise InvalidInput("params must be a JSON array", code="invalid_params")
        param_list = list(params)
        params_json = self._check_payload("params", param_list)
        self._check_params(item.ffqn, param_list)
        key = item.idempotency_key
        if key is not None and "\x00" in key:
            raise InvalidInput("idempotency_key must not contain NUL characters",
                               code="invalid_idempotency_key")
        if key is not None and not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY:
            raise InvalidInput(
                f"idempotency_key must be 1 to {MAX_IDEMPOTENCY_KEY} characters",
                code="invalid_idempotency_key",
            )
        check_time("scheduled_at", item.scheduled_at)
        digest = (digest_of(item.ffqn, params_json, item.scheduled_at, item.paused)
                  if key else None)
        return NewExecution(
            ffqn=item.ffqn,
            params=param_list,
            deployment_id=self.deployment_id,
            id=ident if ident is not None else new_execution_id(),
            idempotency_key=key,
            request_digest=digest,
            scheduled_at=item.scheduled_at,
            paused=item.paused,
        )

    async def submit(
        self,
        ffqn: str,
        params: Sequence[JSON] = (),
        *,
        idempotency_key: str | None = None,
        scheduled_at: datetime | None = None,
        paused: bool = False,
    ) -> tuple[Execution, bool]:
        """Create a pending execution; returns it and whether it was created now."""
        new = self._new(SubmitItem(ffqn, params, idempotency_key, scheduled_at, paused))
        submitted = await self.groups.submit(new)
        if submitted.created and self.on_submitted is not None:
            self.on_submitted()
        if self.telemetry is not None:
            self.telemetry.submitted(new.ffqn, created=submitted.created)
        if not submitted.created and submitted.request_digest != new.request_digest:
            raise Conflict(
                f"idempotency key {idempotency_key!r} was used for a different request "
                f"(execution {submitted.execution.id})",
                code="idempotency_conflict",
            )
        return submitted.execution, submitted.created

    def prepare_many(self, items: Sequence[SubmitItem],
                     refused: Mapping[int, VeracityError] | None = None) -> list[NewExecution]:
        """Check every submission of a batch before anything is written: one or more bad
        ones raise ``invalid_batch`` (422) listing each by index, with its code and
        message (``items``). ``refused``: items the caller found bad already (by index:
        why), listed with the others."""
        out: list[NewExecution] = []
        bad: list[dict[str, object]] = []
        ids = new_execution_ids(len(items))
        known: set[str] = set()
        for index, item in enumerate(items):
            try:
                if refused and index in refused:
                    raise refused[index]
                out.append(self._new(item, ids[index], known))
            except VeracityError as exc:
                bad.append({"index": index, "code": exc.code, "message": exc.message})
        if bad:
            raise InvalidBatch(bad)
        return out

    async def submit_many(self, items: Sequence[SubmitItem]) -> list[tuple[Execution, bool]]:
        """Submit up to MAX_BATCH executions in one transaction, answered in order, each
        with whether it was created now. Each idempotency key works as for :meth:`submit`
        (a key repeated inside the batch answers the first one's execution). Nothing is
        written when the batch is too large (413), any item is bad (422
        ``invalid_batch``) or reuses a key for a different request (409
        ``idempotency_conflict``, naming the items)."""
        if len(items) > MAX_BATCH:
            raise PayloadTooLarge(f"a batch takes at most {MAX_BATCH:,} submissions; this "
                                  f"one has {len(items):,}")
        return await self.submit_prepared(self.prepare_many(items))

    @staticmethod
    def check_repeated_keys(news: Sequence[NewExecution]) -> None:
        """A key given twice among ``news`` for two different requests: 409
        ``idempotency_conflict`` (``items`` naming each later one and the index it
        repeats, ``first_index``), before anything is written. The same key for the same
        request is no conflict: the later item answers the first one's execution."""
        first: dict[str, int] = {}
        bad: list[dict[str, object]] = []
        for index, new in enumerate(news):
            key = new.idempotency_key
            if key is None:
                continue
            earlier = first.setdefault(key, index)
            if earlier != index and news[earlier].request_digest != new.request_digest:
                bad.append({"index": index, "code": "idempotency_conflict",
                            "message": f"idempotency key {key!r} is item {earlier}'s, "
                                       "given here for a different request",
                            "first_index": earlier})
        if bad:
            raise Conflict(
                f"idempotency keys given twice for different requests, at item(s) "
                f"{', '.join(str(b['index']) for b in bad)}; nothing was submitted",
                code="idempotency_conflict", items=bad)

    async def submit_prepared(self, news: Sequence[NewExecution]
                              ) -> list[tuple[Execution, bool]]:
        """Insert submissions :meth:`prepare_many` checked, in one transaction (a key
        repeated among them for a different request is refused first:
        :meth:`check_repeated_keys`)."""
        self.check_repeated_keys(news)
        try:
            submitted = await self.store.execution_submit_many(news)
        except BatchConflict as exc:
            raise Conflict(
                f"idempotency keys used before for a different request, at item(s) "
                f"{', '.join(map(str, exc.indexes))}; nothing was submitted",
                code="idempotency_conflict",
                items=[{"index": i, "code": "idempotency_conflict",
                        "message": f"idempotency key {news[i].idempotency_key!r} names "
                                   f"execution {exc.existing[i]}, submitted with a "
                                   "different request",
                        "execution_id": str(exc.existing[i])} for i in exc.indexes],
            ) from None
        if any(s.created for s in submitted) and self.on_submitted is not None:
            self.on_submitted()
        if self.telemetry is not None:
            counts = collections.Counter((s.execution.ffqn, s.created) for s in submitted)
            for (ffqn, created), count in counts.items():
                self.telemetry.submitted(ffqn, created=created, count=count)
        return [(s.execution, s.created) for s in submitted]

    async def get(self, execution_id: str | uuid.UUID) -> Execution:
        ident = execution_id if isinstance(execution_id, uuid.UUID) else parse_id(execution_id)
        found = await self.store.execution_get(ident)
        if found is None:
            raise NotFound(f"execution {ident} does not exist")
        return found

    async def wait(self, execution_id: str | uuid.UUID, timeout: float) -> Execution:
        """The execution as soon as it is terminal, or as it is after ``timeout`` seconds
        (0 to MAX_WAIT): woken by the store's end signals, not by polling
        (veracity/waiting.py)."""
        if not 0 <= timeout <= MAX_WAIT:
            raise InvalidInput(f"wait must be between 0 and {MAX_WAIT:g} seconds",
                               code="invalid_wait")
        execution = await self.get(execution_id)
        if execution.status.is_terminal or timeout == 0:
            return execution
        if self._waits is None:
            self._waits = EndWaits(self.store)
        await self._waits.wait(execution.id, timeout)
        return await self.get(execution.id)

    def release_waits(self) -> None:
        """Answer every wait under way now, and any new one at once (the server stops)."""
        if self._waits is None:
            self._waits = EndWaits(self.store)
        self._waits.release()

    async def close(self) -> None:
        """Stop what waits for executions to end (its listener's connection)."""
        if self._waits is not None:
            await self._waits.close()

    async def page(
        self, filter: ExecutionFilter, *, limit: int = 50, cursor: str | None = None
    ) -> Page:
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidInput(f"limit must be between 1 and {MAX_LIST_LIMIT}",
                               code="invalid_limit")
        check_time("created_after", filter.created_after)
        check_time("created_before", filter.created_before)
        after = decode_cursor(cursor) if cursor else None
        rows = await self.store.execution_list(filter, limit=limit + 1, after=after)
        items = rows[:limit]
        next_cursor = encode_cursor(items[-1]) if len(rows) > limit else None
        return Page(items, next_cursor, await self.waiting_reasons(items))

    async def workers(self, *, limit: int = 1000) -> list[WorkerView]:
        records = await self.store.worker_list(limit=limit)
        now = await self.store.db_now()
        return [WorkerView(r, self._live(r, now)) for r in records]

    def _live(self, r: WorkerRecord, now: datetime) -> bool:
        return is_live(stopped_at=r.stopped_at, last_heartbeat=r.last_heartbeat,
                       heartbeat_interval=r.heartbeat_interval, now=now,
                       live_within=self.live_within)

    async def crons(self) -> list[CronView]:
        """Each configured cron entry with its last slot, the execution that slot started
        and its status, and the next slot (docs/cron.md)."""
        if not self.cron_entries:
            return []
        records = await self.store.cron_records([e.name for e in self.cron_entries])
        now = await self.store.db_now()
        return [CronView(e, records.get(e.name), e.schedule.next_after(now))
                for e in self.cron_entries]

    async def waiting_reasons(self, items: Sequence[Execution]) -> dict[uuid.UUID, str]:
        """Why each unfinished execution is not finished yet, in words
        (:mod:`veracity.core.waiting`): asleep until T, waiting for a message or for
        children, paused by whom, held by which worker and what recovery will do, scheduled
        for T; and, when no live worker will run it (:mod:`veracity.core.deployments`), why.
        Read in a fixed number of statements however many items (no query per item)."""
        unfinished = [e for e in items if not e.status.is_terminal]
        if not unfinished:
            return {}
        records = await self.store.worker_list(limit=MAX_WORKERS_READ)
        now = await self.store.db_now()
        views = [WorkerView(r, self._live(r, now)) for r in records]
        by_id = {v.record.id: v for v in views}
        coverage = Coverage(
            LiveWorker(v.record.deployment_id, frozenset(v.record.ffqns),
                       frozenset(v.record.upgrade_ffqns))
            for v in views if v.live)
        waits = await self.store.execution_waits(
            [e.id for e in unfinished if e.status in (Status.BLOCKED, Status.PAUSED)],
            shown_children=SHOWN_CHILDREN)
        reasons: dict[uuid.UUID, str] = {}
        for e in unfinished:
            wait = waits.get(e.id, WaitRecord())
            holder = None
            if e.lease_owner is not None:
                view = by_id.get(e.lease_owner)
                holder = Holder(e.lease_owner, view.record.last_heartbeat if view else None,
                                view.live if view else False)
            reason = waiting_reason(Facts(
                status=e.status, now=now, scheduled_at=e.scheduled_at,
                deployment_id=e.deployment_id, attempt=e.attempt, wake_at=e.wake_at,
                lease_owner=e.lease_owner, lease_expires_at=e.lease_expires_at,
                holder=holder, cancel_requested_at=e.cancel_requested_at,
                pause_requested_at=e.pause_requested_at, paused_from=e.paused_from,
                engine=e.engine, external_execution_id=e.external_execution_id,
                triggered_at=e.triggered_at, flag_reason=e.flag_reason,
                end_requested_at=e.end_requested_at,
                blocked=_mapping(wait.events.get("blocked")),
                paused=_mapping(wait.events.get("paused")),
                pause_requested=_mapping(wait.events.get("pause_requested")),
                children={js: Children(n, tuple(first))
                          for js, (n, first) in wait.children.items()},
                coverage=coverage.waiting_reason(
                    status=e.status, ffqn=e.ffqn, deployment_id=e.deployment_id,
                    delegated=e.status == Status.RUNNING and e.engine is not None),
                recovery_interval=self.recovery_interval, max_attempts=self.max_attempts,
            ))
            if reason is not None:
                reasons[e.id] = reason
        return reasons

    # -- deployments (docs/deployments.md) ----------------------------------------------

    async def deployments(self) -> list[DeploymentView]:
        """Every deployment, newest first, with its unfinished executions by status, its
        live workers and its stranded executions."""
        summaries = await self.store.deployment_list(live_within=self.live_within)
        return [DeploymentView(d, d.id == self.deployment_id) for d in summaries]

    async def adopt(self, from_id: str, *, ffqn_prefix: str | None = None,
                    actor: str = "operator") -> AdoptOutcome:
        """Move the stranded executions of deployment ``from_id`` (those whose workflow
        name starts with ``ffqn_prefix``, if given) onto this process's deployment, each
        with an ``adopted`` event in its history. Bad input and refusals change nothing."""
        if not isinstance(from_id, str) or not 1 <= len(from_id) <= MAX_DEPLOYMENT_ID \
                or "\x00" in from_id:
            raise InvalidInput(f"a deployment id is 1 to {MAX_DEPLOYMENT_ID} characters "
                               "(no NUL)", code="invalid_deployment_id")
        if from_id == self.deployment_id:
            raise InvalidInput(
                f"deployment {from_id} is the current deployment: adopting moves executions "
                "of an older deployment onto the current one", code="same_deployment")
        if ffqn_prefix is not None:
            try:
                validate_ffqn_prefix(ffqn_prefix)
            except InvalidFfqn as exc:
                raise InvalidInput(str(exc), code="invalid_ffqn_prefix") from None
        if not actor.strip():
            raise InvalidInput("who adopts must be named", code="invalid_input")
        result = await self.store.deployment_adopt(
            from_id, self.deployment_id, ffqn_prefix=ffqn_prefix, actor=actor,
            live_within=self.live_within)
        if result.refused is not None:
            if result.code == "not_found":
                raise NotFound(result.refused)
            raise Conflict(result.refused, code=result.code)
        if result.execution_ids and self.on_submitted is not None:
            self.on_submitted()  # an in-process worker of this deployment: look now
        return AdoptOutcome(from_id, self.deployment_id, result.execution_ids)

    async def history(
        self, execution_id: str | uuid.UUID, *, after_seq: int = 0, limit: int = 1000
    ) -> list[HistoryEvent]:
        events, _ = await self.history_page(execution_id, after_seq=after_seq, limit=limit)
        return events

    async def history_page(
        self, execution_id: str | uuid.UUID, *, after_seq: int = 0, limit: int = 1000
    ) -> tuple[list[HistoryEvent], int | None]:
        """Up to ``limit`` events after ``after_seq``, and the seq to continue after (None
        on the last page)."""
        execution = await self.get(execution_id)
        if not 1 <= limit <= MAX_HISTORY_LIMIT:
            raise InvalidInput(f"limit must be between 1 and {MAX_HISTORY_LIMIT}",
                               code="invalid_limit")
        if after_seq < 0:
            raise InvalidInput("after_seq must be 0 or more", code="invalid_after_seq")
        events = await self.store.history_list(execution.id, after_seq=after_seq,
                                               limit=limit + 1)
        page = events[:limit]
        return page, (page[-1].seq if len(events) > limit else None)

    # -- operator requests -------------------------------------------------------------

    def _found(self, ident: uuid.UUID, result: ControlResult) -> Execution:
        if result.execution is None:
            raise NotFound(f"execution {ident} does not exist")
        if result.refused is not None:
            raise Conflict(result.refused, code=result.code,
                           state=str(result.execution.status))
        return result.execution

    async def cancel(self, execution_id: str | uuid.UUID, *, actor: str | None = None,
                     reason: str | None = None) -> tuple[Execution, bool]:
        """Cancel (docs/workflows.md): only -cancellable workflows; terminal or repeated: no
        change."""
        execution = await self.get(execution_id)
        if execution.status.is_terminal:
            return execution, False
        if not is_cancellable(execution.ffqn):
            raise Conflict(
                f"{execution.ffqn} cannot be cancelled (it is {execution.status}): only "
                f"workflows whose name ends in {CANCELLABLE_SUFFIX} can. Pause it instead "
                f"(PUT /v1/executions/{execution.id}/pause): a paused execution stays "
                "visible and uses no worker.",
                code="not_cancellable", state=str(execution.status),
            )
        result = await self.store.execution_cancel(execution.id, actor=actor, reason=reason)
        cancelled = self._found(execution.id, result)
        if result.changed:
            self._ended(cancelled)
        if result.changed and self.on_interrupt is not None:
            self.on_interrupt(execution.id)
        if (cancelled.status == Status.RUNNING and cancelled.engine is not None
                and cancelled.external_execution_id is not None):
            # a delegated run ends only once its engine confirms the stop: ask it now
            # (the reconciler asks again every tick until it does)
            look = await self._look_and_apply(cancelled, by=actor or "operator")
            cancelled = await self.get(cancelled.id) if look.action else cancelled
        return cancelled, result.changed

    async def cancel_many(self, ids: Sequence[uuid.UUID], *, actor: str | None = None,
                          reason: str | None = None) -> list[Execution | VeracityError]:
        """Cancel each execution as :meth:`cancel` would, all in one transaction, answered
        in order: the execution, or the error its single cancel would raise (NotFound,
        Conflict not_cancellable). Up to MAX_BATCH ids."""
        if len(ids) > MAX_BATCH:
            raise PayloadTooLarge(f"one request cancels at most {MAX_BATCH:,} executions; "
                                  f"this one names {len(ids):,}")
        results = await self.store.execution_cancel_many(ids, actor=actor, reason=reason)
        answers: list[Execution | VeracityError] = []
        seen: set[uuid.UUID] = set()
        for ident, result in zip(ids, results, strict=True):
            try:
                cancelled = self._found(ident, result)
            except VeracityError as exc:
                answers.append(exc)
                continue
            if result.changed and ident not in seen:
                self._ended(cancelled)
                if self.on_interrupt is not None:
                    self.on_interrupt(ident)
            seen.add(ident)
            if (cancelled.status == Status.RUNNING and cancelled.engine is not None
                    and cancelled.external_execution_id is not None):
                # a delegated run ends only once its engine confirms the stop (as cancel)
                look = await self._look_and_apply(cancelled, by=actor or "operator")
                cancelled = await self.get(cancelled.id) if look.action else cancelled
            answers.append(cancelled)
        return answers

    async def retry(self, execution_id: str | uuid.UUID, *, actor: str | None = None,
                    reason: str | None = None) -> Execution:
        """A new execution retrying a failed (or failed_transient) one: linked to it
        (``retry_of``), in the current deployment, replaying the failed run's recorded calls
        up to its failure (its first failed step, child or schedule) and running on from
        there. The failed execution is left unchanged (docs/workflows.md)."""
        old = await self.get(execution_id)
        if old.status not in (Status.FAILED, Status.FAILED_TRANSIENT):
            raise Conflict(f"execution is {old.status}: only a failed or failed_transient "
                           "execution can be retried", code="wrong_state",
                           state=str(old.status))
        history: list[HistoryEvent] = []
        after = 0
        while True:  # a terminal execution's history no longer grows (but late reports)
            page = await self.store.history_list(old.id, after_seq=after, limit=10_000)
            history += page
            if len(page) < 10_000:
                break
            after = page[-1].seq
        new = NewExecution(ffqn=old.ffqn, params=list(old.params),
                           deployment_id=self.deployment_id, id=new_execution_id(),
                           retry_of=old.id)
        result = await self.store.execution_retry(old.id, new, retry_replay(history),
                                                  actor=actor, reason=reason)
        created = self._found(old.id, result)
        if self.on_submitted is not None:
            self.on_submitted()
        return created

    async def pause(self, execution_id: str | uuid.UUID, *, actor: str | None = None,
                    reason: str | None = None) -> tuple[Execution, bool]:
        """Hold it: pending and blocked ones at once, a running one at its next step
        boundary. ``actor`` and ``reason`` (who and why) are recorded in its history and
        said by its waiting reason."""
        ident = await self._ident(execution_id)
        if actor is not None and (not 1 <= len(actor) <= MAX_ACTOR or "\x00" in actor
                                  or not actor.strip()):
            raise InvalidInput(f"by must be 1 to {MAX_ACTOR} characters, not only spaces "
                               "(no NUL)", code="invalid_input")
        if reason is not None and (not 1 <= len(reason) <= MAX_REASON or "\x00" in reason
                                   or not reason.strip()):
            raise InvalidInput(f"a reason is 1 to {MAX_REASON} characters, not only spaces "
                               "(no NUL)", code="invalid_reason")
        result = await self.store.execution_pause(ident, actor=actor, reason=reason)
        paused = self._found(ident, result)
        if result.changed and paused.status == Status.RUNNING and self.on_interrupt is not None:
            self.on_interrupt(ident)
        return paused, result.changed

    async def unpause(self, execution_id: str | uuid.UUID, *, actor: str | None = None,
                      reason: str | None = None) -> tuple[Execution, bool]:
        ident = await self._ident(execution_id)
        result = await self.store.execution_unpause(ident, actor=actor, reason=reason)
        execution = self._found(ident, result)
        if result.changed and self.on_submitted is not None:
            self.on_submitted()
        return execution, result.changed

    async def send(self, execution_id: str | uuid.UUID, topic: str, payload: JSON, *,
                   actor: str | None = None, reason: str | None = None
                   ) -> tuple[Execution, Message]:
        ident = await self._ident(execution_id)
        if not isinstance(topic, str) or not 1 <= len(topic) <= MAX_TOPIC_LENGTH \
                or "\x00" in topic:
            raise InvalidInput(f"topic must be 1 to {MAX_TOPIC_LENGTH} characters (no NUL)",
                               code="invalid_topic")
        self._check_payload("payload", payload)
        result = await self.store.message_send(ident, topic, payload, actor=actor,
                                               reason=reason)
        execution = self._found(ident, result)
        assert result.message is not None
        if self.on_submitted is not None:
            self.on_submitted()
        return execution, result.message

    # -- external engines ----------------------------------------------------------------

    async def callback(self, execution_id: str | uuid.UUID, token: str | None,
                       report: CallbackReport, payload: JSON, *, transient: bool = False
                       ) -> tuple[Execution, bool]:
        """An engine's /complete or /fail. Returns the execution and whether it changed."""
        ident = await self._ident(execution_id)
        if not token:
            raise Unauthorized("a callback needs its execution's token: "
                               "Authorization: Bearer <token>", code="unauthorized")
        self._check_payload("result" if report is CallbackReport.COMPLETE else "error",
                            payload)
        outcome = await self.store.execution_callback(ident, token, report, payload,
                                                      transient=transient)
        if outcome.outcome is CallbackOutcome.NOT_FOUND:
            raise NotFound(f"execution {ident} does not exist")
        if outcome.outcome is CallbackOutcome.UNAUTHORIZED:
            raise Unauthorized("the callback token is not this execution's",
                               code="unauthorized")
        assert outcome.execution is not None
        if outcome.outcome is CallbackOutcome.APPLIED:
            self._ended(outcome.execution)
        if outcome.outcome is CallbackOutcome.CONFLICT:
            if self.telemetry is not None:
                self.telemetry.late("callback")
            raise Conflict(
                f"execution is already {outcome.execution.status}; the report is kept in "
                "its history", code="already_ended", state=str(outcome.execution.status))
        return outcome.execution, outcome.outcome is CallbackOutcome.APPLIED

    async def resolve(self, execution_id: str | uuid.UUID, *, action: str,
                      external_id: str | None, reason: str, actor: str, force: bool = False
                      ) -> Resolved:
        """An operator resolves a running delegated execution (docs/external.md).

        ``attach`` records the engine's id. ``fail`` and ``cancel`` end the run only once
        its engine confirms it has finished: the request is recorded, the engine asked to
        stop the run, and asked again; until it confirms, the execution stays running
        (the reconciler carries the request on) and the answer is ``stop_requested``, or
        :class:`EngineNotConfirmed` (409) when the engine could not be asked or refused
        the stop. ``force`` ends it anyway, flagged as forced. Without an external id the
        engine cannot be asked at all: the operator's word is all there is, and the end
        is recorded as unconfirmed.
        """
        ident = await self._ident(execution_id)
        if action not in ("attach", "fail", "cancel"):
            raise InvalidInput("action must be attach, fail or cancel", code="invalid_action")
        if action == "attach" and not external_id:
            raise InvalidInput("attach needs external_execution_id", code="invalid_action")
        if action != "attach" and external_id is not None:
            raise InvalidInput("external_execution_id goes only with attach",
                               code="invalid_action")
        if force and action == "attach":
            raise InvalidInput("force applies to fail and cancel, not to attach",
                               code="invalid_force")
        if not reason.strip():
            raise InvalidInput("a resolution needs a written reason", code="invalid_reason")
        act = ResolveAction(action)
        current = await self.get(ident)
        if force and current.engine is None:
            raise InvalidInput(f"force applies only to an execution delegated to an engine; "
                               f"{ident} is not", code="invalid_force")
        if action == "attach":
            result = await self.store.execution_resolve(
                ident, action=act, external_id=external_id, reason=reason, actor=actor)
            return self._resolved(action, Resolved(self._found(ident, result), result.changed,
                                                   "attached", "external id attached"))
        if current.status == Status.RUNNING and current.engine is not None \
                and current.external_execution_id is None:
            why = ("it has no external id: the engine could not be asked whether the run "
                   "exists, nor stopped")
            result = await self.store.execution_resolve(
                ident, action=act, external_id=None, reason=reason, actor=actor,
                expected_external_id=None, unconfirmed=why)
            self._ended(result.execution if result.changed else None)
            return self._resolved(action, Resolved(
                self._found(ident, result), result.changed, "unconfirmed",
                f"ended without the engine's confirmation: {why}"))
        result = await self.store.execution_resolve(
            ident, action=act, external_id=None, reason=reason, actor=actor,
            expected_external_id=current.external_execution_id)
        requested = self._found(ident, result)
        look = await self._look_and_apply(requested, by=actor)
        after = await self.get(ident)
        if after.status.is_terminal:
            confirmed = look.action is not None and after.status == look.action.to
            return self._resolved(action, Resolved(
                after, True, "ended", "the engine confirmed the run finished" if confirmed
                else f"the execution ended meanwhile ({after.status})"))
        why = look.why_unknown or "the engine has not confirmed the run finished"
        if force:
            result = await self.store.execution_resolve(
                ident, action=act, external_id=None, reason=reason, actor=actor,
                expected_external_id=current.external_execution_id, unconfirmed=why)
            self._ended(result.execution if result.changed else None)
            if result.changed and self.telemetry is not None:
                self.telemetry.flagged("operator", "forced")
            return self._resolved(action, Resolved(
                self._found(ident, result), True, "forced",
                f"forced: ended without the engine's confirmation ({why})"))
        if look.stop == "ok":
            return self._resolved(action, Resolved(
                after, True, "stop_requested",
                "the engine accepted the stop; the execution ends once it confirms the run "
                "finished (the reconciler asks again every tick)"))
        self._count_resolution(action, "not_confirmed")
        raise Conflict(
            f"the engine could not confirm the run has finished: {why}. The execution stays "
            "running with your request recorded; the reconciler asks the engine again every "
            "tick and ends it once the engine confirms. To end it now without the engine's "
            "confirmation, resolve again with force.",
            code="engine_not_confirmed", state=str(after.status))

    async def _look_and_apply(self, execution: Execution, *, by: str) -> Look:
        from veracity.adapters.looks import Looker  # the engines' HTTP stack: on first use

        looker = self.looker or Looker({}, {})
        look = await looker.look(execution, await self.store.db_now(), by=by)
        if look.action is not None:
            applied = await self.store.execution_reconcile_apply([look.action])
            if not applied:
                look.action = None
            elif self.telemetry is not None:
                if look.action.kind is WriteKind.TERMINATE:
                    self._ended(await self.store.execution_get(execution.id))
                elif look.action.kind is WriteKind.FLAG and look.action.flag is not None:
                    self.telemetry.flagged("operator", str(look.action.flag))
        return look

    def _ended(self, execution: Execution | None) -> None:
        """Count a transition this process wrote, if it ended the execution."""
        if self.telemetry is not None:
            self.telemetry.end(execution)

    def _resolved(self, action: str, resolved: Resolved) -> Resolved:
        self._count_resolution(action, resolved.outcome)
        return resolved

    def _count_resolution(self, action: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.resolutions.labels(action, outcome).inc()

    async def flag_counts(self) -> dict[str, int]:
        return await self.store.execution_flag_counts()

    # -- the dashboard's reads (docs/dashboard.md) ---------------------------------------

    async def counts_in(self, statuses: Sequence[str]) -> dict[str, int]:
        """How many executions there are in each of ``statuses``, terminal ones too."""
        return await self.store.execution_counts_in(statuses)

    async def history_kinds(self, execution_id: str | uuid.UUID) -> dict[str, int]:
        """How many events of each kind the execution's history holds."""
        execution = await self.get(execution_id)
        return await self.store.history_kind_counts(execution.id)

    async def history_page_of_kinds(
        self, execution_id: str | uuid.UUID, kinds: Sequence[str], *, after_seq: int = 0,
        limit: int = 1000,
    ) -> tuple[list[HistoryEvent], int | None]:
        """As :meth:`history_page`, only events of ``kinds`` (every kind when empty)."""
        if not kinds:
            return await self.history_page(execution_id, after_seq=after_seq, limit=limit)
        execution = await self.get(execution_id)
        if not 1 <= limit <= MAX_HISTORY_LIMIT:
            raise InvalidInput(f"limit must be between 1 and {MAX_HISTORY_LIMIT}",
                               code="invalid_limit")
        events = await self.store.history_list_kinds(execution.id, kinds, after_seq=after_seq,
                                                     limit=limit + 1)
        page = events[:limit]
        return page, (page[-1].seq if len(events) > limit else None)

    async def descendants(self, root: uuid.UUID, *, limit: int = 500
                          ) -> dict[uuid.UUID, list[Execution]]:
        """The tree under ``root``, level by level, at most ``limit`` executions: each
        parent's id to its children, oldest first."""
        tree: dict[uuid.UUID, list[Execution]] = {}
        level = [root]
        seen = 0
        while level and seen < limit:
            found = await self.store.execution_children_of(level, limit=limit - seen)
            seen += len(found)
            for child in found:
                assert child.parent_id is not None
                tree.setdefault(child.parent_id, []).append(child)
            level = [c.id for c in found]
        return tree

    async def _ident(self, execution_id: str | uuid.UUID) -> uuid.UUID:
        return execution_id if isinstance(execution_id, uuid.UUID) else parse_id(execution_id)


# -- API tokens (docs/security.md) -------------------------------------------------------

TOUCH_EVERY = timedelta(seconds=60)
"""last_used_at is written at most this often per token: one write a minute, not one a
request."""

MISSING_TOKEN = ("an API token is needed: send Authorization: Bearer <token> (an operator "
                 "creates one with `veracity token create`)")
UNKNOWN_TOKEN = "unknown API token"


@dataclass(frozen=True, slots=True)
class CreatedToken:
    token: str
    """The token itself: shown once, never stored."""
    record: ApiToken


@dataclass(frozen=True, slots=True)
class TokenView:
    record: ApiToken
    state: TokenState


def _when(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class TokenService:
    """Creating, listing and revoking API tokens (the CLI), and checking the token a
    request carries against the scope its route needs (the API)."""

    def __init__(self, store: ControlStore) -> None:
        self.store = store

    async def create(self, name: str, scopes: Sequence[str], expires: str | None = None
                     ) -> CreatedToken:
        """Everything is checked before anything is written; the token is returned once."""
        try:
            check_name(name)
            granted = parse_scopes(scopes)
            lifetime = parse_expires(expires) if expires is not None else None
        except InvalidTokenRequest as exc:
            raise InvalidInput(str(exc), code="invalid_token") from None
        made = new_secret()
        record = await self.store.token_create(NewApiToken(
            name=name, key_id=made.key_id, token_hash=made.digest,
            scopes=tuple(s.value for s in granted), expires_in=lifetime))
        if record is None:
            existing = await self.store.token_get(name)
            since = f" (created {_when(existing.created_at)})" if existing else ""
            raise Conflict(f"a token named {name!r} exists already{since}; a name is never "
                           "given out twice, even once revoked: choose another name",
                           code="token_exists")
        return CreatedToken(made.token, record)

    async def list(self) -> list[TokenView]:
        now = await self.store.db_now()
        return [TokenView(t, state(t.expires_at, t.revoked_at, now))
                for t in await self.store.token_list()]

    async def revoke(self, name: str) -> tuple[ApiToken, bool]:
        """The token and whether this call revoked it (False: it was revoked already)."""
        revoked = await self.store.token_revoke(name)
        if revoked is not None:
            return revoked, True
        existing = await self.store.token_get(name)
        if existing is None:
            raise NotFound(f"no token named {name!r} (see `veracity token list`)",
                           code="unknown_token")
        return existing, False

    async def authenticate(self, token: str | None, needed: Scope, *, route: str
                           ) -> ApiToken:
        """The token, if it is known, neither expired nor revoked (else Unauthorized) and
        grants ``needed`` (else Forbidden, naming the scope)."""
        if token is None:
            raise Unauthorized(MISSING_TOKEN)
        key_id = key_id_of(token)
        found = await self.store.token_find(key_id) if key_id is not None else None
        if found is None or not matches(token, found.token.token_hash):
            raise Unauthorized(UNKNOWN_TOKEN)
        record, now = found.token, found.now
        current = state(record.expires_at, record.revoked_at, now)
        if current is TokenState.REVOKED:
            assert record.revoked_at is not None
            raise Unauthorized(f"the API token {record.name!r} was revoked at "
                               f"{_when(record.revoked_at)}")
        if current is TokenState.EXPIRED:
            assert record.expires_at is not None
            raise Unauthorized(f"the API token {record.name!r} expired at "
                               f"{_when(record.expires_at)}")
        if not allows(record.scopes, needed):
            raise Forbidden(
                f"the API token {record.name!r} lacks the scope {needed.value}, which "
                f"{route} needs (it has: {', '.join(record.scopes)})",
                scope=needed.value)
        if record.last_used_at is None or now - record.last_used_at >= TOUCH_EVERY:
            try:
                await self.store.token_touch(record.key_id)
            except Exception as exc:  # the request is authorized; its last use is a note
                log.warning("could not record the use of API token %r: %s", record.name,
                            exc, extra={"domain": "api"})
        return record


def _mapping(value: JSON) -> dict[str, JSON] | None:
    return value if isinstance(value, dict) else None
