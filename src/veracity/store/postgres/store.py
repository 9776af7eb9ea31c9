"""PostgreSQL implementation of :class:`veracity.store.protocol.Store`.

Each hot-path operation is one statement (a CTE that changes the row and appends its
history event), run in autocommit mode: one round trip, one transaction.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import psycopg
from psycopg.rows import AsyncRowFactory, RowMaker, dict_row, tuple_row
from psycopg.types.json import Json, set_json_dumps, set_json_loads
from psycopg_pool import AsyncConnectionPool

from veracity.clock import Clock
from veracity.core.states import Status
from veracity.errors import ConfigError
from veracity.models import (
    JSON,
    WAIT_EVENT_KINDS,
    ApiToken,
    Claim,
    DeploymentRecord,
    Execution,
    ExecutionFilter,
    Exit,
    FoundToken,
    HistoryEvent,
    ListCursor,
    NewApiToken,
    NewExecution,
    Submitted,
    TransitionResult,
    WaitRecord,
    WorkerInfo,
    WorkerRecord,
)
from veracity.store import _ops
from veracity.store._common import (
    LIST_STATUSES,
    REPEATED_IN_BATCH,
    Leave,
    RunnerLock,
    check_filter,
    check_journal_kind,
    check_new,
    claim_sources,
    claim_split,
    json_text,
    late_report_event,
    leave_batch,
    lock_key,
    owned_sources,
    read_json,
    require_aware,
)
from veracity.store._shared import SharedMethods
from veracity.store._sql import load_migrations, load_queries

Q = load_queries("veracity.store.postgres")


def _brief(query: str) -> str:
    """The worker's batched exits answer only what its metrics need (``Exit``): the same
    statement, its last SELECT naming five columns instead of the whole row (a batch of
    128 completions measured at 6.59 ms instead of 8.97, of which the worker's CPU 0.99
    ms instead of 2.77: bench/journal.md)."""
    whole = "SELECT *, (CASE WHEN status IN"
    if query.count(whole) != 1:
        raise RuntimeError("execution_leave_many_if_owned no longer ends as _brief expects")
    return query.replace(whole, "SELECT id, ffqn, status, started_at, updated_at, "
                                "(CASE WHEN status IN")


Q["execution_leave_many_brief"] = _brief(Q["execution_leave_many_if_owned"])
MIGRATIONS = load_migrations("veracity.store.postgres")
# pg_advisory_xact_lock key for migrations: "veracity" in ASCII, as a bigint
MIGRATION_LOCK_KEY = 0x7665726163697479

Row = Mapping[str, Any]
log = logging.getLogger("veracity.store")
NOTIFY_CHANNEL = "veracity_pending"
ENDED_CHANNEL = "veracity_ended"
INTERRUPT_CHANNEL = "veracity_interrupt"
HANDOFF_PREFIX = "veracity_handoff_"
RETRIES = 3  # attempts after a lost connection

WINDOW_NAMES = 32
"""An FFQN prefix of this many workflows or more is first looked for among the newest
WINDOW_ROWS rows of its page's range (queries.sql, execution_list_by_ffqn_window), before
a statement per workflow and status."""

WINDOW_ROWS = 200
"""The window's size: a prefix about 1 row in 4 or more has is found in it."""

PREFIX_NAMES_TTL = 60.0
"""Seconds a prefix's count of workflows (``_many_names``), and a window that held less
than a page of a filter's rows, are remembered before they are read again: new workflows
are deployed far less often, and a prefix's share of the rows changes slowly."""

PREFIX_NAMES_KEPT = 1024
"""Prefixes (or filters) remembered at most (all forgotten when full)."""


class _Remembered:
    """Values remembered for PREFIX_NAMES_TTL seconds (time.monotonic(): they only choose
    how a list page is read, never what it answers), at most PREFIX_NAMES_KEPT of them."""

    def __init__(self) -> None:
        self._values: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any) -> Any:
        """The value remembered for ``key``, or None (never, or too long ago)."""
        known = self._values.get(key)
        if known is None or time.monotonic() - known[0] >= PREFIX_NAMES_TTL:
            return None
        return known[1]

    def put(self, key: Any, value: Any) -> None:
        if len(self._values) >= PREFIX_NAMES_KEPT:
            self._values.clear()
        self._values[key] = (time.monotonic(), value)


def _utc(value: datetime | None) -> datetime | None:
    return value.astimezone(UTC) if value is not None else None


def execution_rows(cursor: psycopg.AsyncCursor[Any]) -> RowMaker[Execution]:
    """psycopg row factory: each row of ``veracity_executions`` (a statement's extra
    columns ignored) as an :class:`Execution`, built from the row's tuple
    (``_ops.execution_maker``) instead of from a mapping made of it first."""
    if cursor.description is None:  # pragma: no cover - only statements with rows use it
        raise TypeError("a statement without rows cannot give executions")
    return _ops.execution_maker(tuple(column.name for column in cursor.description))


def row_to_execution(row: Row) -> Execution:
    # the session's time zone is UTC, so timestamps arrive as aware UTC datetimes
    return _ops.execution_from(row)


def list_statement(filter: ExecutionFilter, *, limit: int, after: ListCursor | None = None
                   ) -> tuple[str, dict[str, Any]]:
    """The query of a list page for ``filter`` and its parameters (queries.sql;
    docs/operations.md, What a list page costs): ``flagged`` rows are few, read from their
    own index with any other filter checked on each; otherwise a prefix, a deployment or
    neither is read with each status asked for (or every status) from its (name,
    status), (deployment, status) or status index. (A prefix of many workflows is first
    looked for among the newest rows: PostgresStore.execution_list.)"""
    statuses = sorted({str(s) for s in filter.statuses})
    if filter.flagged:
        return _list_params("execution_list_flagged", statuses, filter, limit, after)
    # (an empty prefix is every workflow's: read as no prefix)
    name = ("execution_list_by_ffqn" if filter.ffqn_prefix
            else "execution_list_by_deployment" if filter.deployment_id is not None
            else "execution_list_by_status")
    return _list_params(name, statuses or LIST_STATUSES, filter, limit, after)


def _list_params(name: str, statuses: list[str], filter: ExecutionFilter, limit: int,
                 after: ListCursor | None) -> tuple[str, dict[str, Any]]:
    return name, {
        "statuses": statuses,
        "ffqn_prefix": filter.ffqn_prefix,
        "deployment_id": filter.deployment_id,
        "created_after": filter.created_after,
        "created_before": filter.created_before,
        "flagged": filter.flagged,
        "cursor_at": after.created_at if after else None,
        "cursor_id": after.id if after else None,
        "limit": limit,
    }


def handoff_channel(owner: str) -> str:
    """The channel a worker hears its hand-offs on (docs/workers.md, "Hand-off to an idle
    worker"): a valid identifier whatever the worker's id."""
    return HANDOFF_PREFIX + hashlib.md5(owner.encode(), usedforsecurity=False).hexdigest()


_HANDED_UUIDS = ("id", "parent_id", "retry_of")
_HANDED_TIMES = ("scheduled_at", "created_at", "updated_at", "lease_expires_at", "wake_at",
                 "cancel_requested_at", "pause_requested_at", "triggered_at", "flagged_at",
                 "end_requested_at", "started_at")


def handed_execution(payload: str) -> Execution:
    """The execution a hand-off's notification carries: its row as ``row_to_json`` wrote
    it (the stored JSON values as they are, ids and times as text), read as a claim reads
    its rows."""
    row = read_json(payload)
    for key in _HANDED_UUIDS:
        if row[key] is not None:
            row[key] = uuid.UUID(row[key])
    for key in _HANDED_TIMES:
        if row[key] is not None:
            row[key] = datetime.fromisoformat(row[key]).astimezone(UTC)
    return _ops.execution_from(row)


def _status_array(statuses: Sequence[str]) -> str:
    """Statuses as a PostgreSQL array literal, for a ``%(...)s::text[]`` parameter: a batch
    of completions names a status per execution, and psycopg's list dumper escapes each
    element with a regular expression (a status is a plain lowercase word: no escaping)."""
    for status in statuses:
        if not status.replace("_", "").isalpha() or not status.islower():
            raise ValueError(f"not a status: {status!r}")
    return "{" + ",".join(statuses) + "}"


@functools.lru_cache(maxsize=256)
def _text_array(values: tuple[str, ...]) -> str:
    """Texts as a PostgreSQL array literal, for a ``%(...)s::text[]`` parameter: each
    element double-quoted, with ``"`` and ``\\`` escaped by a backslash, so any text is
    read back as itself. A claim names the worker's workflows on every call, the same few
    names each time: made once per set (cached) instead of psycopg's list dumper escaping
    each element with a regular expression on every claim."""
    return "{" + ",".join(
        '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


def row_to_worker(row: Row) -> WorkerRecord:
    return WorkerRecord(
        id=row["id"],
        host=row["host"],
        pid=row["pid"],
        deployment_id=row["deployment_id"],
        ffqns=row["ffqns"],
        concurrency=row["concurrency"],
        started_at=cast(datetime, _utc(row["started_at"])),
        last_heartbeat=cast(datetime, _utc(row["last_heartbeat"])),
        stopped_at=_utc(row["stopped_at"]),
        upgrade_ffqns=row["upgrade_ffqns"],
        heartbeat_interval=row["heartbeat_interval"],
        host_key=row["host_key"],
    )


def row_to_token(row: Row) -> ApiToken:
    return ApiToken(
        name=row["name"],
        key_id=row["key_id"],
        token_hash=row["token_hash"],
        scopes=tuple(row["scopes"]),
        created_at=cast(datetime, _utc(row["created_at"])),
        expires_at=_utc(row["expires_at"]),
        revoked_at=_utc(row["revoked_at"]),
        last_used_at=_utc(row["last_used_at"]),
    )


def row_to_event(row: Row) -> HistoryEvent:
    return HistoryEvent(
        execution_id=row["execution_id"],
        seq=row["seq"],
        kind=row["kind"],
        at=cast(datetime, _utc(row["at"])),
        data=row["data"],
    )


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json_param(value: Any) -> str:
    return json.dumps(value, default=_iso)


def _pg_param(value: Any) -> Any:
    if isinstance(value, _ops.JsonParam):
        return Json(value.value, dumps=_json_param)
    return value


async def _drive(conn: psycopg.AsyncConnection[Any], op: _ops.Op) -> Any:
    try:
        query = next(op)
        while True:
            cur = await conn.execute(
                _q(query.name), {k: _pg_param(v) for k, v in query.params.items()}
            )
            rows = cast(list[Row], await cur.fetchall()) if cur.description else []
            query = op.send(rows)
    except StopIteration as stop:
        return stop.value


def _prefix_names_query() -> str:
    """How many workflow names have an FFQN prefix, counted up to %(cap)s: the `names` of
    queries.sql's execution_list_by_ffqn (its first part), the same probes."""
    query = Q["execution_list_by_ffqn"]
    head, tail = "WITH RECURSIVE names (ffqn) AS (", "\n), page (created_at, id) AS ("
    if head not in query or tail not in query:  # pragma: no cover - the file is ours
        raise RuntimeError("queries.sql: execution_list_by_ffqn does not begin with names")
    names = query[query.index(head):query.index(tail)]
    return (names + "\n)\nSELECT count(*) AS n FROM "
            "(SELECT 1 FROM names WHERE ffqn IS NOT NULL LIMIT %(cap)s) AS n\n")


Q["execution_list_prefix_names"] = _prefix_names_query()


def _q(name: str) -> str:
    # queries come from our own package files, never from user input
    return Q[name]


CONNECT_TIMEOUT = 5
"""Seconds a new connection may take to open."""
RECONNECT_WINDOW = 2.0
"""Seconds the pool keeps retrying a lost connection by itself (with its back-off); after
that, connections are opened on demand, so recovery never waits on a long back-off."""
POOL_WAIT = 3.0
"""Seconds a statement waits for a free connection before failing (a database outage is
then answered within 5 s)."""
SESSION_CHECK_WAIT = 5.0
"""Seconds ``check_session`` waits for its notification (it comes within milliseconds
wherever sessions are kept)."""
LOCK_SILENCE = 3.0
"""Seconds a single-runner lock's session may sit silent before the server ends it, and the
lock with it (``idle_session_timeout``): the holder pings it a few times within that while
its tick runs, so only a holder that is frozen (SIGSTOP, a paused VM) or gone loses it."""


class PostgresStore(SharedMethods):
    backend = "postgresql"
    supports_notifications = True
    supports_handoff = True

    def __init__(self, url: str, pool: AsyncConnectionPool[Any], clock: Clock, *,
                 connect_timeout: int = 10, lock_silence: float = LOCK_SILENCE) -> None:
        self._url = url
        self._pool = pool
        self._clock = clock
        self._connect_timeout = connect_timeout
        """Seconds a connection of its own (a single-runner lock's, a LISTEN) may take to
        open: a server that accepts and never answers fails the tick after this long."""
        self._lock_silence = lock_silence
        self._prefix_names = _Remembered()
        """Per FFQN prefix, whether WINDOW_NAMES workflows or more had it
        (``_many_names``)."""
        self._window_misses = _Remembered()
        """The filters of a prefix of many workflows (not their dates or cursor) whose
        window held less than a page (execution_list): not read again meanwhile, the page
        read by its workflows and statuses."""

    @classmethod
    async def open(
        cls, url: str, *, clock: Clock, pool_size: int = 10, connect_timeout: int = 10,
        lock_silence: float = LOCK_SILENCE, generic_plans: bool = False,
    ) -> PostgresStore:
        if not 0.1 <= lock_silence <= 3600:  # idle_session_timeout counts milliseconds
            raise ValueError(f"lock_silence must be between 0.1 and 3600 s, not {lock_silence}")
        # One direct connection first: an unreachable or misnamed database fails here at
        # once with the server's own message, instead of as a pool timeout.
        first = await psycopg.AsyncConnection.connect(url, connect_timeout=connect_timeout)
        await first.close()

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            set_json_loads(read_json, conn)
            # what psycopg's Json() writes (submissions' params, events' data): the text of
            # json.dumps, its default, made faster (json_text)
            set_json_dumps(json_text, conn)
            await conn.execute("SET TIME ZONE 'UTC'")
            # Every statement here reads a few pages; JIT compiling one costs hundreds of
            # milliseconds. The planner turns it on by its cost estimate alone, which on a
            # large table exceeds jit_above_cost for plans that read next to nothing (the
            # list's FFQN-prefix probe at 10M rows: 237 ms, nearly all of it compiling;
            # bench/journal.md, Growth).
            await conn.execute("SET jit = off")
            if generic_plans:
                # A worker's statements (claims, lease renewals, completions, checkpoints)
                # find their rows by key or by a partial index, whatever the values. Left
                # to choose, PostgreSQL planned the claim anew on every execution (its
                # generic plan's estimate is higher), some 0.7 ms of the worker's path
                # from a submission to its start (docs/scaling.md). Their generic plans
                # are checked in tests/store/test_list_plans.py.
                await conn.execute("SET plan_cache_mode = force_generic_plan")

        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=max(1, pool_size),
            open=False,
            kwargs={"autocommit": True, "row_factory": dict_row,
                    "connect_timeout": CONNECT_TIMEOUT},
            configure=configure,
            name="veracity",
            # After an outage the pool must not sit out a long back-off while the database
            # is back: it gives up reconnecting a lost connection after a short window,
            # and the next request opens a new one at once (docs/operations.md).
            reconnect_timeout=RECONNECT_WINDOW,
            # A request waits this long for a connection; during an outage it is answered
            # 503 database_unavailable instead of hanging.
            timeout=POOL_WAIT,
        )
        await pool.open(wait=True, timeout=15)
        return cls(url, pool, clock, connect_timeout=connect_timeout, lock_silence=lock_silence)

    async def close(self) -> None:
        await self._pool.close()

    def _now(self) -> datetime | None:
        return self._clock.now()

    async def _fetchall(self, name: str, params: Mapping[str, Any],
                        rows: AsyncRowFactory[Any] = dict_row, *,
                        planning: str | None = None) -> list[Any]:
        """Run one statement, its rows as ``rows`` makes them (mappings by default). If its
        connection turns out to be dead (the backend was terminated, the server restarted),
        check the pool and try again on a fresh one.

        A retried statement is one that did not commit, except in the rare case where the
        connection died between the commit and its answer: every statement here is safe to
        repeat then (a repeated fenced write is refused and kept as a late report; a
        repeated submission finds its own row by id; a lost claim expires and is recovered).

        ``planning``: the name of a statement of ``SET LOCAL`` planner settings, run first
        in a transaction with this one (a list page's, ``list_planning``)."""
        for attempt in range(RETRIES + 1):
            broken = False
            try:
                async with self._pool.connection() as conn:
                    try:
                        cur = conn.cursor(row_factory=rows)
                        if planning is None:
                            await cur.execute(_q(name), params)
                            return cast(list[Any], await cur.fetchall())
                        async with conn.transaction():
                            await conn.execute(_q(planning), prepare=False)
                            await cur.execute(_q(name), params)
                            return cast(list[Any], await cur.fetchall())
                    except psycopg.OperationalError:
                        broken = conn.broken or conn.closed
                        raise
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                # aborted as a deadlock victim: it did not commit; run it again
                if attempt == RETRIES:
                    raise
                await asyncio.sleep(0.01 * (attempt + 1))
                continue
            except psycopg.OperationalError as exc:
                if not broken or attempt == RETRIES:
                    raise
                log.warning("database connection lost (%s); retrying on a new one",
                            str(exc).strip().splitlines()[0] if str(exc).strip() else exc,
                            extra={"domain": "store"})
                await self._pool.check()
        raise AssertionError("unreachable")

    async def _op(self, factory: Callable[[], _ops.Op], *, transaction: bool = True) -> Any:
        """Drive a multi-statement operation in one transaction. A transaction that lost its
        connection, or that PostgreSQL aborted as a deadlock victim, is run again from the
        start (it did not commit).

        ``transaction=False``: each statement commits by itself, without the two round
        trips of ``BEGIN`` and ``COMMIT``, for an operation whose only write is one
        statement and which is safe to run again from the start after that statement
        committed (a group of submissions: each finds its own row by id)."""
        for attempt in range(RETRIES + 1):
            broken = False
            try:
                async with self._pool.connection() as conn:
                    try:
                        if not transaction:
                            return await _drive(conn, factory())
                        async with conn.transaction():
                            return await _drive(conn, factory())
                    except psycopg.OperationalError:
                        broken = conn.broken or conn.closed
                        raise
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure,
                    _ops.ConflictVanished):
                # (ConflictVanished: a submission whose key's execution retention deleted
                # meanwhile; the transaction rolled back, and the key is free now)
                if attempt == RETRIES:
                    raise
                await asyncio.sleep(0.01 * (attempt + 1))
            except psycopg.OperationalError:
                if not broken or attempt == RETRIES:
                    raise
                await self._pool.check()
        raise AssertionError("unreachable")

    async def _executions(self, name: str, params: Mapping[str, Any]) -> list[Execution]:
        """Run one statement whose rows are executions (``execution_rows``)."""
        return cast(list[Execution], await self._fetchall(name, params, execution_rows))

    async def _fetchone(self, name: str, params: Mapping[str, Any]) -> Row | None:
        rows = await self._fetchall(name, params)
        return rows[0] if rows else None

    # -- schema ---------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        applied_now: list[int] = []
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(_q("migrations_lock"), {"key": MIGRATION_LOCK_KEY})
            await conn.execute(_q("migrations_ledger"))
            cur = await conn.execute(_q("migrations_applied"))
            done = {row["version"] for row in await cur.fetchall()}
            for mig in MIGRATIONS:
                if mig.version in done:
                    continue
                await conn.execute(mig.sql)
                await conn.execute(
                    _q("migrations_record"), {"version": mig.version, "name": mig.name}
                )
                applied_now.append(mig.version)
        return applied_now

    async def ping(self) -> None:
        await self._fetchall("ping", {})

    async def check_session(self, wait: float = SESSION_CHECK_WAIT) -> None:
        """Raise :class:`ConfigError` unless a notification sent from the pool reaches a
        connection of this process that listens for it. A connection pooler in transaction
        mode drops it: the client that listened is not linked to a server connection while
        it waits. Through such a pooler Veracity's sessions are not kept, and with them its
        notifications (an execution handed off to a worker that never hears of it), psycopg's
        prepared statements (one client's run with another's parameters) and its
        single-runner locks break (docs/scaling.md, "Connection poolers"): a server and a
        worker check at start and refuse to run."""
        channel = f"veracity_session_check_{uuid.uuid4().hex}"
        conn = await psycopg.AsyncConnection.connect(
            self._url, autocommit=True, connect_timeout=self._connect_timeout)
        heard = False
        try:
            await conn.execute(f"LISTEN {channel}")
            await self._fetchall("session_check_notify", {"channel": channel})
            # only our own channel counts: through a pooler in transaction mode a server
            # connection keeps the LISTENs of the clients it served before, and another
            # process's check notification can reach this connection while it is linked
            # to that server connection (the likely way one of five commands started at
            # once through pgbouncer passed the check; tests/store/test_session_check.py)
            deadline = time.monotonic() + wait
            while not heard and (left := deadline - time.monotonic()) > 0:
                async for note in conn.notifies(timeout=left, stop_after=1):
                    heard = note.channel == channel
        finally:
            await conn.close()
        if not heard:
            raise ConfigError(
                f"a notification sent to this process's own database connection did not "
                f"arrive within {wait:g} s: its connections "
                "do not keep their sessions, as through a connection pooler in transaction "
                "mode. Veracity needs each connection's session kept: connect directly, or "
                "through a pooler in session mode (docs/scaling.md, \"Connection poolers\")")

    # -- executions -----------------------------------------------------------------

    async def execution_submit(self, new: NewExecution) -> Submitted:
        check_new(new)
        params = {
            "id": new.id,
            "ffqn": new.ffqn,
            "params": Json(new.params),
            "deployment_id": new.deployment_id,
            "parent_id": new.parent_id,
            "join_set": new.join_set,
            "paused": new.paused,
            "idempotency_key": new.idempotency_key,
            "request_digest": new.request_digest,
            "scheduled_at": new.scheduled_at,
            "now": self._now(),
        }
        for _ in range(RETRIES + 1):
            row = await self._fetchone("execution_submit", params)
            if row is not None:
                return Submitted(_ops.submitted_execution(new, row), True,
                                 new.request_digest)
            # a conflict: the idempotency key exists (ON CONFLICT waited for its inserter
            # to commit), or this very insert committed before a lost connection made us
            # repeat it
            row = await self._fetchone(
                "execution_by_key_or_id",
                {"idempotency_key": new.idempotency_key, "id": new.id},
            )
            if row is not None:
                ours = row["id"] == new.id
                return Submitted(row_to_execution(row), ours, row["request_digest"])
            # retention deleted the row the key named since the insert found it: the key
            # is free again (docs/operations.md, Retention), so submit again
        raise _ops.ConflictVanished(new.idempotency_key)

    async def execution_get(self, execution_id: uuid.UUID) -> Execution | None:
        found = await self._executions("execution_get", {"id": execution_id})
        return found[0] if found else None

    async def execution_list(
        self, filter: ExecutionFilter, *, limit: int, after: ListCursor | None = None
    ) -> list[Execution]:
        check_filter(filter)
        require_aware(after.created_at if after else None)
        name, params = list_statement(filter, limit=limit, after=after)
        if name == "execution_list_by_ffqn" and await self._many_names(filter.ffqn_prefix):
            # (the same filters' window found nothing within PREFIX_NAMES_TTL: not again)
            key = (filter.ffqn_prefix or "", *params["statuses"], "|",
                   filter.deployment_id or "", str(filter.flagged))
            if not self._window_misses.get(key):
                found = await self._fetchall("execution_list_by_ffqn_window",
                                             {**params, "window": WINDOW_ROWS},
                                             execution_rows, planning="list_planning")
                if found:  # a page of the window's rows, or the whole range's
                    return cast(list[Execution], found)
                self._window_misses.put(key, True)
        return cast(list[Execution], await self._fetchall(
            name, params, execution_rows, planning="list_planning"))

    async def _many_names(self, prefix: str | None) -> bool:
        """Whether WINDOW_NAMES workflows or more have the prefix (a probe each), counted
        again after PREFIX_NAMES_TTL seconds: the count only chooses how a page is read
        (either way reads the same page), and costs a statement, which a prefix of few
        workflows should not pay on every page."""
        known = self._prefix_names.get(prefix)
        if known is not None:
            return bool(known)
        (row,) = await self._fetchall("execution_list_prefix_names",
                                      {"ffqn_prefix": prefix, "cap": WINDOW_NAMES})
        many = int(row["n"]) >= WINDOW_NAMES
        self._prefix_names.put(prefix, many)
        return many

    async def history_list(
        self, execution_id: uuid.UUID, *, after_seq: int = 0, limit: int = 1000
    ) -> list[HistoryEvent]:
        rows = await self._fetchall(
            "history_list", {"id": execution_id, "after_seq": after_seq, "limit": limit}
        )
        return [row_to_event(r) for r in rows]

    # -- leases ---------------------------------------------------------------------

    async def execution_claim(
        self, owner: str, ffqns: Sequence[str], *, limit: int, lease_ttl: timedelta,
        deployment_id: str | None = None, upgrade_ffqns: Sequence[str] = (),
    ) -> list[Execution]:
        if limit <= 0 or not ffqns:
            return []
        pinned, upgrading = claim_split(ffqns, deployment_id, upgrade_ffqns)
        return await self._executions(
            "execution_claim",
            {
                "owner": owner,
                "deployment_id": deployment_id,
                "pinned": _text_array(tuple(pinned)),
                "upgrading": _text_array(tuple(upgrading)),
                "limit": limit,
                "ttl": lease_ttl,
                "now": self._now(),
                "from_states": _text_array(tuple(claim_sources())),
            },
        )

    async def _late_report(
        self, report: str, claim: Claim, payload: JSON, reason: str | None = None
    ) -> TransitionResult:
        current = await self.execution_get(claim.execution_id)
        if current is None:
            return TransitionResult(False, None, "execution does not exist")
        late = late_report_event(report, claim, payload, current, reason)
        row = await self._fetchone(
            "execution_late_report",
            {"id": claim.execution_id, "event": Json(late), "now": self._now()},
        )
        log.warning(
            "late report refused: %s", late["reason"],
            extra={"domain": "worker", "execution_id": str(claim.execution_id),
                   "report": report, "owner": claim.owner, "epoch": claim.epoch},
        )
        return TransitionResult(
            False, row_to_execution(row) if row else current, cast(str, late["reason"])
        )

    async def _leave_many_if_owned(self, owner: str, items: Sequence[Leave], *,
                                   brief: bool = False) -> list[TransitionResult]:
        unique = leave_batch(owner, items)
        rows = await self._fetchall(
            "execution_leave_many_brief" if brief else "execution_leave_many_if_owned",
            {
                # one JSON array of rows, each value's JSON text a string in it (see
                # execution_leave_many_if_owned in queries.sql)
                "rows": json_text([
                    (str(i.claim.execution_id), i.claim.epoch, str(i.to), i.retry_in,
                     json_text(i.result) if i.to == Status.COMPLETED else None,
                     None if i.error is None else json_text(i.error), json_text(i.event))
                    for i in unique]),
                "owner": owner,
                "from_states": _status_array(
                    sorted({s for to in {i.to for i in unique} for s in owned_sources(to)})),
                "now": self._now(),
            },
            tuple_row if brief else execution_rows,
        )
        done: dict[uuid.UUID, TransitionResult] = {
            row[0]: TransitionResult(True, None, exit=Exit(row[0], row[1], Status(row[2]),
                                                           row[3], row[4]))
            for row in rows
        } if brief else {execution.id: TransitionResult(True, execution) for execution in rows}
        out: list[TransitionResult] = []
        for item in items:
            if item.claim.execution_id in done:
                # only the first occurrence was applied; a repeat is a late report
                out.append(done.pop(item.claim.execution_id))
            else:
                out.append(await self._late_report(item.report, item.claim, item.payload))
        return out

    async def execution_checkpoint_many_if_owned(
        self, owner: str, items: Sequence[tuple[Claim, str, JSON]]
    ) -> list[TransitionResult]:
        if any(claim.owner != owner for claim, _, _ in items):
            raise ValueError("every claim of a batch must belong to its owner")
        for _, kind, _ in items:
            check_journal_kind(kind)
        first: dict[uuid.UUID, tuple[Claim, str, JSON]] = {}
        for item in items:
            first.setdefault(item[0].execution_id, item)
        unique = list(first.values())
        rows = await self._fetchall(
            "execution_checkpoint_many_if_owned",
            {
                # one JSON array of rows, each value's JSON text a string in it (see
                # execution_leave_many_if_owned in queries.sql)
                "rows": json_text([(str(c.execution_id), c.epoch, k, json_text(d))
                                    for c, k, d in unique]),
                "owner": owner,
                "now": self._now(),
            },
        ) if unique else []
        applied = {row["id"] for row in rows}
        out: list[TransitionResult] = []
        repeats: set[uuid.UUID] = set()
        for claim, kind, data in items:
            if claim.execution_id in applied:
                applied.discard(claim.execution_id)  # a repeat in the batch is refused
                out.append(TransitionResult(True, None))
            else:
                out.append(await self._late_report(
                    kind, claim, data,
                    REPEATED_IN_BATCH if claim.execution_id in repeats else None))
            repeats.add(claim.execution_id)
        return out

    async def lease_renew(
        self, owner: str, leases: Sequence[Claim], ttl: timedelta
    ) -> list[Claim]:
        rows = await self._fetchall(
            "lease_renew",
            {
                "owner": owner,
                "ids": [c.execution_id for c in leases],
                "epochs": [c.epoch for c in leases],
                "ttl": ttl,
                "now": self._now(),
            },
        )
        return [Claim(row["id"], owner, row["lease_epoch"]) for row in rows]

    # -- workers --------------------------------------------------------------------

    async def worker_register(self, info: WorkerInfo) -> WorkerRecord:
        row = await self._fetchone(
            "worker_register",
            {
                "id": info.id,
                "host": info.host,
                "pid": info.pid,
                "deployment_id": info.deployment_id,
                "ffqns": Json(info.ffqns),
                "upgrade_ffqns": Json(info.upgrade_ffqns),
                "concurrency": info.concurrency,
                "heartbeat_interval": info.heartbeat_interval,
                "host_key": info.host_key,
                "now": self._now(),
            },
        )
        assert row is not None
        return row_to_worker(row)

    async def worker_stop(self, worker_id: str) -> None:
        await self._fetchall("worker_stop", {"id": worker_id, "now": self._now()})

    async def worker_running_on(self, host_key: str) -> list[WorkerRecord]:
        rows = await self._fetchall("worker_running_on", {"host_key": host_key})
        return [row_to_worker(r) for r in rows]

    async def worker_gone(self, host_key: str, workers: Sequence[tuple[str, int]]) -> int:
        if not workers:
            return 0
        rows = await self._fetchall("worker_gone", {
            "rows": Json([{"id": wid, "pid": pid} for wid, pid in workers]),
            "host_key": host_key, "now": self._now()})
        return len(rows)

    async def worker_list(self, *, limit: int = 1000) -> list[WorkerRecord]:
        rows = await self._fetchall("worker_list", {"limit": limit, "now": self._now()})
        return [row_to_worker(r) for r in rows]

    async def execution_waits(self, ids: Sequence[uuid.UUID], *, shown_children: int = 5
                              ) -> dict[uuid.UUID, WaitRecord]:
        if not ids:
            return {}
        ids = list(dict.fromkeys(ids))
        events = await self._fetchall("history_newest_of_kinds", {
            "ids": ids, "kinds": list(WAIT_EVENT_KINDS)})
        children = await self._fetchall("execution_unfinished_children", {
            "ids": ids, "shown": shown_children})
        return _ops.waits_from(ids, events, children)

    async def deployment_seen(self, deployment_id: str) -> DeploymentRecord:
        row = await self._fetchone("deployment_seen", {"id": deployment_id,
                                                       "now": self._now()})
        assert row is not None
        return _ops.deployment_from(row)

    async def deployment_get(self, deployment_id: str) -> DeploymentRecord | None:
        row = await self._fetchone("deployment_get", {"id": deployment_id})
        return _ops.deployment_from(row) if row else None

    # -- API tokens -----------------------------------------------------------------

    async def token_create(self, new: NewApiToken) -> ApiToken | None:
        row = await self._fetchone("token_create", {
            "name": new.name, "key_id": new.key_id, "token_hash": new.token_hash,
            "scopes": Json(list(new.scopes)), "expires_in": new.expires_in,
            "now": self._now(),
        })
        return row_to_token(row) if row else None

    async def token_get(self, name: str) -> ApiToken | None:
        row = await self._fetchone("token_get", {"name": name})
        return row_to_token(row) if row else None

    async def token_find(self, key_id: str) -> FoundToken | None:
        row = await self._fetchone("token_find", {"key_id": key_id, "now": self._now()})
        if row is None:
            return None
        return FoundToken(row_to_token(row), cast(datetime, _utc(row["db_now"])))

    async def token_list(self) -> list[ApiToken]:
        return [row_to_token(r) for r in await self._fetchall("token_list", {})]

    async def token_revoke(self, name: str) -> ApiToken | None:
        row = await self._fetchone("token_revoke", {"name": name, "now": self._now()})
        return row_to_token(row) if row else None

    async def token_touch(self, key_id: str) -> None:
        await self._fetchall("token_touch", {"key_id": key_id, "now": self._now()})

    async def db_now(self) -> datetime:
        row = await self._fetchone("db_now", {"now": self._now()})
        assert row is not None
        return cast(datetime, _utc(row["now"]))

    # -- coordination ---------------------------------------------------------------

    @asynccontextmanager
    async def single_runner(self, name: str) -> AsyncIterator[RunnerLock]:
        key = lock_key(name)
        # a connection of its own for the whole tick: the lock lives in its session
        conn = await psycopg.AsyncConnection.connect(
            self._url, autocommit=True, row_factory=dict_row,
            connect_timeout=self._connect_timeout,
        )
        try:
            cur = await conn.execute(_q("lock_try"), {
                "key": key, "silence_ms": str(round(self._lock_silence * 1000))})
            row = await cur.fetchone()
            acquired = bool(row and row["acquired"])
        except BaseException:
            await conn.close()
            raise

        async def still_held() -> bool:
            # the lock lives as long as this session: a dead connection has lost it
            try:
                await conn.execute(_q("ping"))
            except Exception:
                return False
            return True

        tick_over = asyncio.Event()

        async def keep_talking() -> None:
            # the server ends a session silent for lock_silence (lock_try): ping well
            # within it for as long as the tick runs, however long that is; never cut
            # short mid-statement (the tick's end waits for a ping under way)
            while True:
                try:
                    async with asyncio.timeout(self._lock_silence / 3):
                        await tick_over.wait()
                    return
                except TimeoutError:
                    if not await still_held():
                        return

        pinger = asyncio.create_task(keep_talking()) if acquired else None
        try:
            yield RunnerLock(acquired, still_held)
        finally:
            tick_over.set()
            if pinger is not None:
                await pinger
            if acquired:
                try:
                    await conn.execute(_q("lock_release"), {"key": key})
                except Exception:
                    # closing ends the session, and with it every lock it held
                    log.warning("could not release the %s lock; closing its connection", name,
                                extra={"domain": name})
            await conn.close()

    async def execution_ended_among(self, ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        if not ids:
            return set()
        rows = await self._fetchall("execution_ended_among", {"ids": list(ids)})
        return {row["id"] for row in rows}

    @asynccontextmanager
    async def ended_signals(self, wake: Callable[[], None]
                            ) -> AsyncIterator[Callable[[], bool]]:
        conn = await psycopg.AsyncConnection.connect(
            self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT)

        async def listen() -> None:
            try:
                async for _ in conn.notifies():
                    wake()
            finally:
                wake()  # the caller checks now, and finds the signals lost

        try:
            await conn.execute(f"LISTEN {ENDED_CHANNEL}")
            reader = asyncio.create_task(listen(), name="veracity-ended-listen")
        except BaseException:
            await conn.close()
            raise
        try:
            yield lambda: not reader.done()
        finally:
            reader.cancel()
            try:
                await asyncio.gather(reader, return_exceptions=True)
            finally:  # closed even if the caller is cancelled meanwhile
                await conn.close()

    async def interrupt_notifications(self) -> AsyncIterator[uuid.UUID]:
        conn = await psycopg.AsyncConnection.connect(
            self._url, autocommit=True, connect_timeout=self._connect_timeout
        )
        try:
            await conn.execute(f"LISTEN {INTERRUPT_CHANNEL}")
            async for note in conn.notifies():
                try:
                    yield uuid.UUID(note.payload)
                except ValueError:
                    continue
        finally:
            await conn.close()

    async def pending_notifications(self, handoff_to: str | None = None
                                    ) -> AsyncIterator[Execution | None]:
        conn = await psycopg.AsyncConnection.connect(
            self._url, autocommit=True, connect_timeout=self._connect_timeout
        )
        try:
            # both in one round trip (statements without parameters)
            await conn.execute(f"LISTEN {NOTIFY_CHANNEL}" if handoff_to is None else
                               f"LISTEN {NOTIFY_CHANNEL}; LISTEN {handoff_channel(handoff_to)}")
            # listening now: what became pending before could not be heard, so look once
            yield None
            async for note in conn.notifies():
                yield None if note.channel == NOTIFY_CHANNEL else handed_execution(note.payload)
        finally:
            await conn.close()

    async def offer_post(self, owner: str, *, deployment_id: str, ffqns: Sequence[str],
                         lease_ttl: timedelta, expires_in: timedelta) -> None:
        await self._fetchall("offer_post", {
            "owner": owner, "deployment_id": deployment_id,
            "ffqns": _text_array(tuple(sorted(set(ffqns)))),
            "channel": handoff_channel(owner), "ttl": lease_ttl, "expires_in": expires_in,
            "now": self._now()})

    async def offer_refresh(self, owner: str, *, expires_in: timedelta) -> bool:
        return bool(await self._fetchall("offer_refresh", {
            "owner": owner, "expires_in": expires_in, "now": self._now()}))

    async def offer_withdraw(self, owner: str) -> bool:
        return bool(await self._fetchall("offer_withdraw", {"owner": owner}))
