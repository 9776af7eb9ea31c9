"""SQLite implementation of :class:`veracity.store.protocol.Store`.

The embedded default for a single host. All access goes through one connection owned by
one thread (sqlite3 connections are not for sharing); async callers hand work to it.
Every write runs in ``BEGIN IMMEDIATE``, which takes SQLite's single write lock up front,
so a guarded UPDATE and its history event commit together and concurrent writers (other
threads or processes on the same file) queue behind the lock instead of interleaving.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import heapq
import json
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

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
    late_report_event,
    leave_batch,
    owned_sources,
    read_json,
    require_aware,
)
from veracity.store._shared import SharedMethods
from veracity.store._sql import load_migrations, load_queries

Q = load_queries("veracity.store.sqlite")
MIGRATIONS = load_migrations("veracity.store.sqlite")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BUSY_TIMEOUT_S = 30.0
log = logging.getLogger("veracity.store")

T = TypeVar("T")


def to_us(value: datetime) -> int:
    if value.tzinfo is None:
        raise ValueError("naive datetime: Veracity stores only timezone-aware times")
    return (value - EPOCH) // timedelta(microseconds=1)


def from_us(value: int) -> datetime:
    return EPOCH + timedelta(microseconds=value)


def _dumps(value: JSON) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _loads(value: str | None) -> JSON:
    return None if value is None else read_json(value)


def row_to_execution(row: sqlite3.Row) -> Execution:
    return Execution(
        id=uuid.UUID(row["id"]),
        ffqn=row["ffqn"],
        params=read_json(row["params"]),
        status=Status(row["status"]),
        result=_loads(row["result"]),
        error=_loads(row["error"]),
        attempt=row["attempt"],
        deployment_id=row["deployment_id"],
        parent_id=uuid.UUID(row["parent_id"]) if row["parent_id"] else None,
        idempotency_key=row["idempotency_key"],
        scheduled_at=from_us(row["scheduled_at"]),
        created_at=from_us(row["created_at"]),
        updated_at=from_us(row["updated_at"]),
        lease_owner=row["lease_owner"],
        lease_epoch=row["lease_epoch"],
        lease_expires_at=(
            from_us(row["lease_expires_at"]) if row["lease_expires_at"] is not None else None
        ),
        history_seq=row["history_seq"],
        join_set=row["join_set"],
        wake_at=_opt_time(row["wake_at"]),
        signal_seq=row["signal_seq"],
        paused_from=row["paused_from"],
        cancel_requested_at=_opt_time(row["cancel_requested_at"]),
        pause_requested_at=_opt_time(row["pause_requested_at"]),
        engine=row["engine"],
        external_execution_id=row["external_execution_id"],
        triggered_at=_opt_time(row["triggered_at"]),
        callback_token_hash=row["callback_token_hash"],
        flagged_at=_opt_time(row["flagged_at"]),
        flag_reason=row["flag_reason"],
        flag_kind=row["flag_kind"],
        end_request=_loads(row["end_request"]),
        end_requested_at=_opt_time(row["end_requested_at"]),
        retry_of=uuid.UUID(row["retry_of"]) if row["retry_of"] else None,
        started_at=from_us(row["started_at"]) if row["started_at"] is not None else None,
    )


def row_to_exit(row: sqlite3.Row) -> Exit:
    """What a batched exit answers (``Exit``), from the row it wrote, without the rest of
    the row turned into an ``Execution``."""
    return Exit(uuid.UUID(row["id"]), row["ffqn"], Status(row["status"]),
                _opt_time(row["started_at"]), from_us(row["updated_at"]))


def _list_query(lead: str, name: str = "execution_list") -> str:
    """A query of the list (queries.sql, execution_list by default) read from the index
    whose expression ``lead`` compares: its first term, ``true``, is the one replaced."""
    query = Q[name]
    if "\nWHERE true\n" not in query:  # pragma: no cover - the file is ours
        raise RuntimeError(f"queries.sql: {name}'s first term is not `true`")
    return query.replace("\nWHERE true\n", f"\nWHERE {lead}\n", 1)


_LEADS = {
    "status": "CAST(status AS TEXT) = :status",
    "ffqn": "CAST(ffqn AS TEXT) = :ffqn AND CAST(status AS TEXT) = :status",
    "deployment": "CAST(deployment_id AS TEXT) = :deployment_id AND CAST(status AS TEXT) = :status",
    "flagged": "flagged_at IS NOT NULL",
}
"""Each filter a page can be read by: the term its index is keyed on (migration 0017's
status index, 0021's of a workflow name or a deployment with the status, 0012's of the
flagged ones). A name or a deployment is read one status at a time: each value of a
lead is the parameters its term takes."""

_LIST = {key: _list_query(term) for key, term in _LEADS.items()}
"""The list's page by its leading filter."""

def _keys_query(query: str) -> str:
    """``query`` (a page of _LIST) answering the rows' (created_at, id) alone."""
    rows = "\nSELECT * FROM veracity_executions\n"
    if rows not in query:  # pragma: no cover - the file is ours
        raise RuntimeError("queries.sql: execution_list does not select * first")
    return query.replace(rows, "\nSELECT created_at, id FROM veracity_executions\n", 1)


_FLOOR = {"status": _list_query(_LEADS["status"], "execution_list_floor")}
"""The window's floor in a status's index (``_window_page``)."""

_KEYS = {key: _keys_query(query) for key, query in _LIST.items()}
"""The same page's keys alone, newest first (the rows fetched once the pages of several
values are merged: a prefix of many workflows reads each one's keys, not its rows)."""

_COUNT = {key: "SELECT count(*) AS n FROM (SELECT 1 FROM veracity_executions WHERE "
               f"{term} AND created_at > :lower_at AND (created_at, id) < (:upper_at, "
               ":upper_id) LIMIT :cap)" for key, term in _LEADS.items()}
"""How many rows a filter's index holds in the page's range, counted up to :cap (its
entries only: the rows are not read)."""

LEAD_CAP_PAGES = (4, 32, 256)
"""A page of filters combined is read by the filter with the fewest rows in its range,
counted up to this many pages' worth, then (when each filter had as many) up to the next
(``_lead``): the counting costs about the smallest filter's rows, at most the last."""

WINDOW_VALUES = 32
"""A prefix with this many values or more to read (its (workflow, status) pairs, or its
workflows times the statuses asked for) is first looked for among the newest WINDOW_PAGES
pages of rows in its range (``_window_page``): a prefix most rows have is found there after
about a page of rows, in place of a statement per value."""

WINDOW_PAGES = 4
"""The window's size, in pages: a page is found in it when about 1 row in 4 or more has
the filters. Reading it in vain costs about as much as a page's 20 values' statements
(4 pages: 11.6 ms for a status with a rare prefix of 200 workflows on 400,000 rows, 10.4
without the window; 10 pages: 15.4 to 16.1 ms; docs/operations.md)."""

_NO_LOWER_AT = -(2**63)
"""A lower bound of created_at below every row's (microseconds since the epoch, INTEGER)."""
_NO_UPPER_AT = 2**63 - 1
"""An upper bound of created_at above every row's."""


def _prefix_end(prefix: str) -> str:
    """The least string above every string that starts with ``prefix``, in code point
    order (SQLite's BINARY order of UTF-8 text): its last character's successor (past the
    surrogates, which no stored text holds). With no successor, a string above any FFQN
    (512 characters at most)."""
    while prefix:
        last = ord(prefix[-1])
        if last < 0x10FFFF:
            return prefix[:-1] + chr(0xE000 if 0xD800 <= last + 1 <= 0xDFFF else last + 1)
        prefix = prefix[:-1]
    return "\U0010ffff" * 513


def _opt_time(value: int | None) -> datetime | None:
    return from_us(value) if value is not None else None


def row_to_worker(row: sqlite3.Row) -> WorkerRecord:
    return WorkerRecord(
        id=row["id"],
        host=row["host"],
        pid=row["pid"],
        deployment_id=row["deployment_id"],
        ffqns=json.loads(row["ffqns"]),
        concurrency=row["concurrency"],
        started_at=from_us(row["started_at"]),
        last_heartbeat=from_us(row["last_heartbeat"]),
        stopped_at=from_us(row["stopped_at"]) if row["stopped_at"] is not None else None,
        upgrade_ffqns=json.loads(row["upgrade_ffqns"]),
        heartbeat_interval=row["heartbeat_interval"],
        host_key=row["host_key"],
    )


def row_to_token(row: sqlite3.Row) -> ApiToken:
    return ApiToken(
        name=row["name"],
        key_id=row["key_id"],
        token_hash=row["token_hash"],
        scopes=tuple(json.loads(row["scopes"])),
        created_at=from_us(row["created_at"]),
        expires_at=_opt_time(row["expires_at"]),
        revoked_at=_opt_time(row["revoked_at"]),
        last_used_at=_opt_time(row["last_used_at"]),
    )


def row_to_event(row: sqlite3.Row) -> HistoryEvent:
    return HistoryEvent(
        execution_id=uuid.UUID(row["execution_id"]),
        seq=row["seq"],
        kind=row["kind"],
        at=from_us(row["at"]),
        data=read_json(row["data"]),
    )


def path_from_url(url: str) -> Path:
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise ValueError(f"not an SQLite URL: {url!r} (expected sqlite:///path)")
    return Path(url[len(prefix) :])



def _require_database(path: Path) -> None:
    """A Veracity database at ``path``, or a ConfigError saying what to do: never create
    one where a command only meant to read."""
    hint = "run `veracity migrate` or set database_url"
    if not path.is_file():
        raise ConfigError(f"no Veracity database at {path}; {hint}")
    try:
        with contextlib.closing(sqlite3.connect(f"file:{quote(str(path))}?mode=ro",
                                                   uri=True)) as conn:
            found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                                 "AND name = 'veracity_executions'").fetchone()
    except sqlite3.Error as exc:
        raise ConfigError(f"{path} is not a Veracity database ({exc}); {hint}") from None
    if found is None:
        raise ConfigError(f"{path} holds no Veracity database; {hint}")

_COMMIT_HOOKS: dict[Path, set[Callable[[], None]]] = {}
"""By database file: what to call after each commit of a store of this process on it
(``SqliteStore.ended_signals``)."""


class SqliteStore(SharedMethods):
    backend = "sqlite"
    supports_notifications = False
    supports_handoff = False

    def __init__(self, path: Path, clock: Clock) -> None:
        self._path = path
        self._resolved = path.resolve()
        self._clock = clock
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="veracity-sqlite")
        self._conn: sqlite3.Connection | None = None

    @classmethod
    async def open(cls, url: str, *, clock: Clock, create: bool = True) -> SqliteStore:
        path = path_from_url(url)
        if not create:
            _require_database(path)
        store = cls(path, clock)
        try:
            await store._run(store._connect)
        except BaseException:
            store._executor.shutdown(wait=False)
            raise
        return store

    # -- plumbing -------------------------------------------------------------------

    def _connect(self) -> None:
        if self._path.parent and not self._path.parent.exists():
            raise FileNotFoundError(f"folder of the SQLite database does not exist: {self._path}")
        conn = sqlite3.connect(
            self._path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        # switching a new file to WAL needs a moment without writers, and SQLite answers
        # "database is locked" at once instead of applying the busy timeout: retry
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    conn.close()
                    raise
                time.sleep(0.01)
        conn.execute("PRAGMA synchronous = FULL")  # durable when the call returns
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA recursive_triggers = ON")  # cancellation climbs the tree
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        self._conn = conn

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    def _c(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("the SQLite store is closed")
        return self._conn

    def _write(self, fn: Callable[[sqlite3.Connection, int], T]) -> T:
        """Run ``fn(conn, now_us)`` in one IMMEDIATE transaction."""
        conn = self._c()
        conn.execute("BEGIN IMMEDIATE")
        try:
            out = fn(conn, self._now_us(conn))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        hooks = _COMMIT_HOOKS.get(self._resolved)
        if hooks:
            for hook in list(hooks):
                hook()
        return out

    def _now_us(self, conn: sqlite3.Connection) -> int:
        """The transaction's time: the injected clock's, else the database's. An embedded
        database's clock is this host's clock, which SQLite's ``'now'`` reads to the
        millisecond only; read here to the microsecond, times recorded one after another
        keep their order against other readers of the host's clock (an engine's stop, say)
        instead of being rounded up to half a millisecond into the past."""
        injected = self._clock.now()
        return to_us(injected if injected is not None else datetime.now(UTC))

    def _all(self, name: str, params: Mapping[str, Any]) -> list[sqlite3.Row]:
        return self._c().execute(Q[name], params).fetchall()

    def _event(
        self, conn: sqlite3.Connection, execution_id: str, seq: int, kind: str, at: int, data: JSON
    ) -> None:
        conn.execute(
            Q["history_insert"],
            {"execution_id": execution_id, "seq": seq, "kind": kind, "at": at,
             "data": _dumps(data)},
        )

    async def close(self) -> None:
        def _close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await self._run(_close)
        self._executor.shutdown(wait=True)

    # -- schema ---------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        def work(conn: sqlite3.Connection, now: int) -> list[int]:
            conn.execute(Q["migrations_ledger"])
            done = {r["version"] for r in conn.execute(Q["migrations_applied"]).fetchall()}
            applied: list[int] = []
            for mig in MIGRATIONS:
                if mig.version in done:
                    continue
                for statement in _split_statements(mig.sql):
                    conn.execute(statement)
                conn.execute(Q["migrations_record"], {"version": mig.version, "name": mig.name})
                applied.append(mig.version)
            return applied

        return await self._run(self._write, work)

    async def ping(self) -> None:
        await self._run(self._all, "ping", {})

    async def check_session(self) -> None:
        """One process's own file: no pooler between it and its sessions."""

    # -- executions -----------------------------------------------------------------

    async def execution_submit(self, new: NewExecution) -> Submitted:
        check_new(new)

        def work(conn: sqlite3.Connection, now: int) -> Submitted:
            row = conn.execute(
                Q["execution_insert"],
                {
                    "id": str(new.id),
                    "ffqn": new.ffqn,
                    "params": _dumps(new.params),
                    "deployment_id": new.deployment_id,
                    "parent_id": str(new.parent_id) if new.parent_id else None,
                    "join_set": new.join_set,
                    "status": "paused" if new.paused else "pending",
                    "paused_from": "pending" if new.paused else None,
                    "idempotency_key": new.idempotency_key,
                    "request_digest": new.request_digest,
                    "scheduled_at": to_us(new.scheduled_at) if new.scheduled_at else None,
                    "now": now,
                },
            ).fetchone()
            if row is None:
                existing = conn.execute(
                    Q["execution_by_key_or_id"],
                    {"idempotency_key": new.idempotency_key, "id": str(new.id)},
                ).fetchone()
                ours = existing["id"] == str(new.id)
                return Submitted(row_to_execution(existing), ours, existing["request_digest"])
            ex = row_to_execution(row)
            self._event(conn, row["id"], 1, str(ex.status), now, {
                "ffqn": ex.ffqn,
                "params": ex.params,
                "deployment_id": ex.deployment_id,
                "scheduled_at": ex.scheduled_at.isoformat(),
                "parent_id": str(ex.parent_id) if ex.parent_id else None,
                "join_set": ex.join_set,
                "idempotency_key": ex.idempotency_key,
            })
            return Submitted(ex, True, new.request_digest)

        return await self._run(self._write, work)

    async def execution_get(self, execution_id: uuid.UUID) -> Execution | None:
        rows = await self._run(self._all, "execution_get", {"id": str(execution_id)})
        return row_to_execution(rows[0]) if rows else None

    async def execution_list(
        self, filter: ExecutionFilter, *, limit: int, after: ListCursor | None = None
    ) -> list[Execution]:
        check_filter(filter)
        require_aware(after.created_at if after else None)
        # the range of (created_at, id) a page reads (queries.sql, execution_list): above
        # created_after; below the earlier of created_before (any id) and the cursor
        upper = (_NO_UPPER_AT, "")
        if filter.created_before is not None:
            upper = (to_us(filter.created_before), "")
        if after is not None:
            upper = min(upper, (to_us(after.created_at), str(after.id)))
        params = {
            "statuses": _dumps([str(s) for s in filter.statuses]) if filter.statuses else None,
            "ffqn_prefix": filter.ffqn_prefix,
            "deployment_id": filter.deployment_id,
            "lower_at": (to_us(filter.created_after) if filter.created_after is not None
                         else _NO_LOWER_AT),
            "upper_at": upper[0],
            "upper_id": upper[1],
            "flagged": None if filter.flagged is None else int(filter.flagged),
            "limit": limit,
        }
        rows = await self._run(self._list_rows, filter, params)
        return [row_to_execution(r) for r in rows]

    def _list_rows(self, filter: ExecutionFilter, params: dict[str, Any]) -> list[sqlite3.Row]:
        """A page of the list, in one read transaction (one snapshot): ``_read_page``."""
        conn = self._c()
        conn.execute("BEGIN")
        try:
            page = self._read_page(conn, filter, params)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return page

    def _read_page(self, conn: sqlite3.Connection, filter: ExecutionFilter,
                   params: dict[str, Any]) -> list[sqlite3.Row]:
        """A page of the list, read from the index of its leading filter (queries.sql,
        execution_list): one query per value of it (a status; a workflow name with the
        prefix, or the deployment, and a status), their keys merged and the page's rows
        read. A prefix of many workflows is first looked for in the newest rows
        (``_window_page``)."""
        leads: list[tuple[str, list[dict[str, str]]]] = []  # each filter given
        statuses = sorted({str(s) for s in filter.statuses})
        if statuses:
            leads.append(("status", [{"status": s} for s in statuses]))
        if filter.ffqn_prefix:  # (an empty one is every workflow's: no filter)
            bounds = {"ffqn_prefix": filter.ffqn_prefix,
                      "ffqn_end": _prefix_end(filter.ffqn_prefix)}
            pairs = self._prefix_pairs(conn, bounds, statuses, WINDOW_VALUES)
            if len(pairs) >= WINDOW_VALUES:  # (the first of them only: all, further on)
                # one status asked for: its rows' window; none or several: all rows'
                # (flagged ones are few: read from their own index, not looked for)
                one = statuses[0] if len(statuses) == 1 else None
                if not filter.flagged and (
                        found := self._window_page(conn, params, one)) is not None:
                    return found
                pairs = self._prefix_pairs(conn, bounds, statuses, None)
            leads.append(("ffqn", pairs))
        if filter.deployment_id is not None:
            leads.append(("deployment", [{"deployment_id": filter.deployment_id, "status": s}
                                         for s in statuses or LIST_STATUSES]))
        if filter.flagged:
            leads.append(("flagged", [{}]))
        if not leads:
            return list(conn.execute(Q["execution_list"], params).fetchall())
        key, values = self._lead(conn, leads, params)
        if key != "flagged":  # the leading term checks the status: its own is out
            params = {**params, "statuses": None}
        if key == "ffqn":  # each name found has the prefix
            params = {**params, "ffqn_prefix": None}
        if not values:  # a prefix no workflow has
            return []
        if len(values) == 1:
            return list(conn.execute(_LIST[key], {**params, **values[0]}).fetchall())
        ids = self._merged_keys(conn, _KEYS[key], values, params)
        by_id = {r["id"]: r for r in conn.execute(Q["execution_list_rows"],
                                                  {"ids": _dumps(ids)})}
        return [by_id[i] for i in ids]

    @staticmethod
    def _merged_keys(conn: sqlite3.Connection, query: str, values: list[dict[str, str]],
                     params: dict[str, Any]) -> list[str]:
        """The ids of a page read from several values of one index (``query``, a page's
        keys, newest first), in two rounds: each value's newest ``share`` keys (two pages
        spread over the values, at least one), then, below the last key a value gave, the
        keys newer than the page's oldest so far of the values that may have more of them
        (the others have none: their next keys are older than a page of keys already
        read). A prefix of many workflows reads about two pages of keys in all, not a page
        per workflow; with few values, ``share`` is a page and the second round reads
        nothing."""
        limit = params["limit"]
        share = max(1, -(-2 * limit // len(values)))
        plain = conn.cursor()
        plain.row_factory = None  # (created_at, id) tuples, as they compare
        firsts = [plain.execute(query, {**params, **v, "limit": share}).fetchall()
                  for v in values]
        keys = sorted((k for got in firsts for k in got), reverse=True)
        oldest = keys[limit - 1] if len(keys) >= limit else None  # of the page so far
        for v, got in zip(values, firsts, strict=True):
            if len(got) < share or (oldest is not None and got[-1] <= oldest):
                continue  # no more keys, or none that could be on the page
            bounds = {"upper_at": got[-1][0], "upper_id": got[-1][1]}
            if oldest is not None:  # (created_at > oldest's - 1 microsecond: at or after)
                bounds["lower_at"] = max(params["lower_at"], oldest[0] - 1)
            keys += plain.execute(query, {**params, **v, **bounds}).fetchall()
        return [k[1] for k in heapq.nlargest(limit, keys)]

    @staticmethod
    def _prefix_pairs(conn: sqlite3.Connection, bounds: dict[str, str],
                      statuses: list[str], cap: int | None) -> list[dict[str, str]]:
        """The (workflow, status) values a prefix is read by: with statuses asked for, each
        workflow with the prefix and each of them (queries.sql, execution_list_ffqns);
        without, each pair with the prefix that has rows (execution_list_pairs). ``cap``:
        no more than that many (or about as many: whole workflows), enough to tell a
        prefix of many workflows."""
        if statuses:
            names = -1 if cap is None else -(-cap // len(statuses))
            found = conn.execute(Q["execution_list_ffqns"], {**bounds, "cap": names})
            return [{"ffqn": r["ffqn"], "status": s} for r in found for s in statuses]
        found = conn.execute(Q["execution_list_pairs"], {**bounds, "cap": cap or -1})
        return [{"ffqn": r["ffqn"], "status": r["status"]} for r in found]

    @staticmethod
    def _window_page(conn: sqlite3.Connection, params: dict[str, Any],
                     status: str | None) -> list[sqlite3.Row] | None:
        """The page of ``params`` (every filter) if it lies among the newest WINDOW_PAGES
        pages of rows in its range, or of ``status``'s rows: read newest first from
        veracity_executions_created, or that status's index, each filter checked on each
        row, no further back than the window's floor (queries.sql, execution_list_floor).
        None when the window held less than a page of rows with the filters: the page is
        further back, and read value by value."""
        window = WINDOW_PAGES * params["limit"]
        lead = {} if status is None else {"status": status}
        floor_query = Q["execution_list_floor"] if status is None else _FLOOR["status"]
        floor = conn.execute(floor_query, {
            "lower_at": params["lower_at"], "upper_at": params["upper_at"],
            "upper_id": params["upper_id"], "window": window, **lead}).fetchone()
        query = Q["execution_list"] if status is None else _LIST["status"]
        if floor is None:  # the range holds no more rows than the window: all of it
            return list(conn.execute(query, {**params, **lead}).fetchall())
        page = conn.execute(query, {**params, **lead, "lower_at": floor["created_at"]}
                            ).fetchall()
        return page if len(page) == params["limit"] else None

    @staticmethod
    def _lead(conn: sqlite3.Connection, leads: list[tuple[str, list[dict[str, str]]]],
              params: dict[str, Any]) -> tuple[str, list[dict[str, str]]]:
        """The filter a page of several is read by: the one whose index holds the fewest
        rows in the page's range (each value counted up to LEAD_CAP_PAGES pages), the
        first given on a tie. SQLite plans without statistics: reading a common status
        for a rare deployment would read every row of that status."""
        if len(leads) == 1:
            return leads[0]
        counted: list[int] = []
        for pages in LEAD_CAP_PAGES:
            cap = pages * params["limit"]
            counted = []
            for key, values in leads:
                total = 0
                for v in values:
                    total += conn.execute(_COUNT[key], {
                        "lower_at": params["lower_at"], "upper_at": params["upper_at"],
                        "upper_id": params["upper_id"], "cap": cap - total, **v,
                    }).fetchone()["n"]
                    if total >= cap:
                        break
                counted.append(total)
            if min(counted) < cap:  # one filter has fewer: it leads
                break
        return leads[counted.index(min(counted))]

    async def history_list(
        self, execution_id: uuid.UUID, *, after_seq: int = 0, limit: int = 1000
    ) -> list[HistoryEvent]:
        rows = await self._run(
            self._all,
            "history_list",
            {"id": str(execution_id), "after_seq": after_seq, "limit": limit},
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

        def work(conn: sqlite3.Connection, now: int) -> list[Execution]:
            rows = conn.execute(
                Q["execution_claim"],
                {
                    "owner": owner,
                    "deployment_id": deployment_id,
                    "pinned": _dumps(pinned),
                    "upgrading": _dumps(upgrading),
                    "limit": limit,
                    "ttl_us": lease_ttl // timedelta(microseconds=1),
                    "now": now,
                    "from_states": _dumps(claim_sources()),
                },
            ).fetchall()
            claimed = sorted((row_to_execution(r) for r in rows),
                             key=lambda e: (e.scheduled_at, e.id))
            seqs = {r["id"]: r["history_seq"] for r in rows}
            for ex in claimed:
                self._event(conn, str(ex.id), seqs[str(ex.id)], "running", now, {
                    "owner": owner, "epoch": ex.lease_epoch, "attempt": ex.attempt,
                    "deployment_id": ex.deployment_id})
            return claimed

        return await self._run(self._write, work)

    def _late_report(
        self, conn: sqlite3.Connection, now: int, report: str, claim: Claim, payload: JSON,
        reason: str | None = None,
    ) -> TransitionResult:
        got = conn.execute(Q["execution_get"], {"id": str(claim.execution_id)}).fetchone()
        if got is None:
            return TransitionResult(False, None, "execution does not exist")
        late = late_report_event(report, claim, payload, row_to_execution(got), reason)
        bumped = conn.execute(
            Q["execution_bump_history"], {"id": str(claim.execution_id), "by": 1}
        ).fetchone()
        self._event(conn, bumped["id"], bumped["history_seq"], "late_report", now, late)
        log.warning(
            "late report refused: %s", late["reason"],
            extra={"domain": "worker", "execution_id": str(claim.execution_id),
                   "report": report, "owner": claim.owner, "epoch": claim.epoch},
        )
        return TransitionResult(False, row_to_execution(bumped), str(late["reason"]))

    def _owned(self, conn: sqlite3.Connection, claim: Claim, now: int) -> sqlite3.Row | None:
        """The row, if ``claim`` holds its lease (the fence: execution_lock_owned)."""
        row: sqlite3.Row | None = conn.execute(
            Q["execution_lock_owned"],
            {"id": str(claim.execution_id), "owner": claim.owner, "epoch": claim.epoch,
             "now": now},
        ).fetchone()
        return row

    async def _leave_many_if_owned(self, owner: str, items: Sequence[Leave], *,
                                   brief: bool = False) -> list[TransitionResult]:
        first = {id(item) for item in leave_batch(owner, items)}

        def work(conn: sqlite3.Connection, now: int) -> list[TransitionResult]:
            out: list[TransitionResult] = []
            for item in items:
                row = None
                if id(item) in first and self._owned(conn, item.claim, now) is not None:
                    row = conn.execute(Q["execution_leave"], {
                        "id": str(item.claim.execution_id),
                        "to_status": str(item.to),
                        "from_states": _dumps(owned_sources(item.to)),
                        "result": _dumps(item.result) if item.to == Status.COMPLETED else None,
                        "error": _dumps(item.error) if item.error is not None else None,
                        "retry_in_us": round(item.retry_in * 1_000_000)
                        if item.retry_in is not None else None,
                        "now": now,
                    }).fetchone()
                if row is None:
                    out.append(self._late_report(conn, now, item.report, item.claim,
                                                 item.payload))
                    continue
                self._event(conn, row["id"], row["history_seq"], str(item.to), now,
                            item.event)
                out.append(TransitionResult(True, None, exit=row_to_exit(row)) if brief
                           else TransitionResult(True, row_to_execution(row)))
            return out

        return await self._run(self._write, work)

    async def execution_checkpoint_many_if_owned(
        self, owner: str, items: Sequence[tuple[Claim, str, JSON]]
    ) -> list[TransitionResult]:
        if any(claim.owner != owner for claim, _, _ in items):
            raise ValueError("every claim of a batch must belong to its owner")
        for _, kind, _ in items:
            check_journal_kind(kind)

        def work(conn: sqlite3.Connection, now: int) -> list[TransitionResult]:
            out: list[TransitionResult] = []
            seen: set[uuid.UUID] = set()
            for claim, kind, data in items:
                row = None
                if claim.execution_id not in seen and self._owned(conn, claim, now):
                    row = conn.execute(
                        Q["execution_bump_history"], {"id": str(claim.execution_id), "by": 1}
                    ).fetchone()
                if row is None:
                    out.append(self._late_report(
                        conn, now, kind, claim, data,
                        REPEATED_IN_BATCH if claim.execution_id in seen else None))
                    seen.add(claim.execution_id)
                    continue
                seen.add(claim.execution_id)
                self._event(conn, row["id"], row["history_seq"], kind, now, data)
                out.append(TransitionResult(True, None))
            return out

        return await self._run(self._write, work)

    async def lease_renew(
        self, owner: str, leases: Sequence[Claim], ttl: timedelta
    ) -> list[Claim]:
        ttl_us = ttl // timedelta(microseconds=1)

        def work(conn: sqlite3.Connection, now: int) -> list[Claim]:
            conn.execute(Q["worker_heartbeat"], {"owner": owner, "now": now})
            conn.execute(Q["deployment_touch"], {"owner": owner, "now": now})
            renewed: list[Claim] = []
            for lease in leases:
                if lease.owner != owner or self._owned(conn, lease, now) is None:
                    continue
                row = conn.execute(
                    Q["lease_extend"],
                    {"id": str(lease.execution_id), "ttl_us": ttl_us, "now": now},
                ).fetchone()
                renewed.append(Claim(uuid.UUID(row["id"]), owner, row["lease_epoch"]))
            return renewed

        return await self._run(self._write, work)

    # -- workers --------------------------------------------------------------------

    async def worker_register(self, info: WorkerInfo) -> WorkerRecord:
        def work(conn: sqlite3.Connection, now: int) -> WorkerRecord:
            # the worker, and its deployment in the registry (first seen now, or again)
            conn.execute(Q["deployment_seen"], {"id": info.deployment_id, "now": now})
            row = conn.execute(
                Q["worker_register"],
                {"id": info.id, "host": info.host, "pid": info.pid,
                 "deployment_id": info.deployment_id, "ffqns": _dumps(info.ffqns),
                 "upgrade_ffqns": _dumps(info.upgrade_ffqns),
                 "concurrency": info.concurrency,
                 "heartbeat_interval": info.heartbeat_interval,
                 "host_key": info.host_key, "now": now},
            ).fetchone()
            return row_to_worker(row)

        return await self._run(self._write, work)

    async def worker_stop(self, worker_id: str) -> None:
        def work(conn: sqlite3.Connection, now: int) -> None:
            conn.execute(Q["worker_stop"], {"id": worker_id, "now": now}).fetchall()

        await self._run(self._write, work)

    async def worker_running_on(self, host_key: str) -> list[WorkerRecord]:
        rows = await self._run(self._all, "worker_running_on", {"host_key": host_key})
        return [row_to_worker(r) for r in rows]

    async def worker_gone(self, host_key: str, workers: Sequence[tuple[str, int]]) -> int:
        def work(conn: sqlite3.Connection, now: int) -> int:
            ended = 0
            for worker_id, pid in workers:
                marked = conn.execute(Q["worker_gone_mark"], {
                    "id": worker_id, "pid": pid, "host_key": host_key, "now": now,
                }).fetchall()
                if marked:
                    ended += len(conn.execute(Q["worker_gone_leases_end"],
                                              {"id": worker_id, "now": now}).fetchall())
            return ended

        if not workers:
            return 0
        return await self._run(self._write, work)

    async def worker_list(self, *, limit: int = 1000) -> list[WorkerRecord]:
        rows = await self._run(self._all, "worker_list", {"limit": limit})
        return [row_to_worker(r) for r in rows]

    async def execution_waits(self, ids: Sequence[uuid.UUID], *, shown_children: int = 5
                              ) -> dict[uuid.UUID, WaitRecord]:
        if not ids:
            return {}
        ids = list(dict.fromkeys(ids))
        params = {"ids": _dumps([str(i) for i in ids]), "kinds": _dumps(WAIT_EVENT_KINDS),
                  "shown": shown_children}

        def work() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            conn = self._c()
            return ([_normalise(r) for r in conn.execute(Q["history_newest_of_kinds"], params)],
                    [_normalise(r) for r in conn.execute(Q["execution_unfinished_children"],
                                                         params)])

        events, children = await self._run(work)
        return _ops.waits_from(ids, events, children)

    async def deployment_seen(self, deployment_id: str) -> DeploymentRecord:
        def work(conn: sqlite3.Connection, now: int) -> DeploymentRecord:
            row = conn.execute(Q["deployment_seen"], {"id": deployment_id, "now": now}
                               ).fetchone()
            return _ops.deployment_from(_normalise(row))

        return await self._run(self._write, work)

    async def deployment_get(self, deployment_id: str) -> DeploymentRecord | None:
        rows = await self._run(self._all, "deployment_get", {"id": deployment_id})
        return _ops.deployment_from(_normalise(rows[0])) if rows else None

    # -- API tokens -----------------------------------------------------------------

    async def token_create(self, new: NewApiToken) -> ApiToken | None:
        expires_in_us = (new.expires_in // timedelta(microseconds=1)
                         if new.expires_in is not None else None)

        def work(conn: sqlite3.Connection, now: int) -> ApiToken | None:
            row = conn.execute(Q["token_create"], {
                "name": new.name, "key_id": new.key_id, "token_hash": new.token_hash,
                "scopes": _dumps(list(new.scopes)), "expires_in_us": expires_in_us,
                "now": now,
            }).fetchone()
            return row_to_token(row) if row else None

        return await self._run(self._write, work)

    async def token_get(self, name: str) -> ApiToken | None:
        rows = await self._run(self._all, "token_get", {"name": name})
        return row_to_token(rows[0]) if rows else None

    async def token_find(self, key_id: str) -> FoundToken | None:
        def work() -> FoundToken | None:
            conn = self._c()
            row = conn.execute(Q["token_find"], {"key_id": key_id}).fetchone()
            if row is None:
                return None
            return FoundToken(row_to_token(row), from_us(self._now_us(conn)))

        return await self._run(work)

    async def token_list(self) -> list[ApiToken]:
        return [row_to_token(r) for r in await self._run(self._all, "token_list", {})]

    async def token_revoke(self, name: str) -> ApiToken | None:
        def work(conn: sqlite3.Connection, now: int) -> ApiToken | None:
            row = conn.execute(Q["token_revoke"], {"name": name, "now": now}).fetchone()
            return row_to_token(row) if row else None

        return await self._run(self._write, work)

    async def token_touch(self, key_id: str) -> None:
        def work(conn: sqlite3.Connection, now: int) -> None:
            conn.execute(Q["token_touch"], {"key_id": key_id, "now": now})

        await self._run(self._write, work)

    async def db_now(self) -> datetime:
        def work() -> int:
            return self._now_us(self._c())

        return from_us(await self._run(work))

    # -- coordination ---------------------------------------------------------------

    @asynccontextmanager
    async def single_runner(self, name: str) -> AsyncIterator[RunnerLock]:
        # An exclusive flock on a file beside the database: held for the whole tick however
        # long it takes, never waited for (LOCK_NB), and freed by the kernel if the holder
        # dies. flock locks belong to the open file, so two stores in one process exclude
        # each other too.
        lock_path = self._path.with_name(f"{self._path.name}.{name}.lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            acquired = True
        except BlockingIOError:
            acquired = False
        try:
            yield RunnerLock(acquired)  # a flock is held until released or the process dies
        finally:
            if acquired:
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _now(self) -> datetime | None:
        # the transaction's own time is used instead (see _op)
        return None

    async def _op(self, factory: Callable[[], _ops.Op], *, transaction: bool = True) -> Any:
        # always one transaction (``transaction`` is moot: the writer is one connection and
        # a batch's first events are a statement of their own here)
        def work(conn: sqlite3.Connection, now: int) -> Any:
            op = factory()
            try:
                query = next(op)
                while True:
                    params = {k: _sqlite_param(v) for k, v in query.params.items()}
                    if "now" in params:
                        params["now"] = now
                    rows = conn.execute(Q[query.name], params).fetchall()
                    query = op.send([_normalise(r) for r in rows])
            except StopIteration as stop:
                return stop.value

        return await self._run(self._write, work)

    async def execution_ended_among(self, ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        if not ids:
            return set()
        rows = await self._run(self._all, "execution_ended_among",
                               {"ids": _dumps([str(i) for i in ids])})
        return {uuid.UUID(row["id"]) for row in rows}

    @asynccontextmanager
    async def ended_signals(self, wake: Callable[[], None]
                            ) -> AsyncIterator[Callable[[], bool]]:
        # SQLite has no notifications: every commit of this process's stores on the file
        # wakes the caller, which checks (writers of other processes are not seen)
        loop = asyncio.get_running_loop()

        def committed() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(wake)

        key = self._path.resolve()
        _COMMIT_HOOKS.setdefault(key, set()).add(committed)
        try:
            yield lambda: True
        finally:
            hooks = _COMMIT_HOOKS.get(key, set())
            hooks.discard(committed)
            if not hooks:
                _COMMIT_HOOKS.pop(key, None)

    async def interrupt_notifications(self) -> AsyncIterator[uuid.UUID]:
        raise NotImplementedError("SQLite has no notifications; workers learn at heartbeat")
        yield uuid.UUID(int=0)  # pragma: no cover - makes this an async generator

    async def pending_notifications(self, handoff_to: str | None = None
                                    ) -> AsyncIterator[Execution | None]:
        raise NotImplementedError("SQLite has no notifications; workers poll")
        yield None  # pragma: no cover - makes this an async generator

    async def offer_post(self, owner: str, *, deployment_id: str, ffqns: Sequence[str],
                         lease_ttl: timedelta, expires_in: timedelta) -> None:
        raise NotImplementedError("SQLite has no hand-offs (they need notifications)")

    async def offer_refresh(self, owner: str, *, expires_in: timedelta) -> bool:
        raise NotImplementedError("SQLite has no hand-offs (they need notifications)")

    async def offer_withdraw(self, owner: str) -> bool:
        raise NotImplementedError("SQLite has no hand-offs (they need notifications)")


UUID_COLUMNS = frozenset({"id", "parent_id", "execution_id", "retry_of",
                          "last_execution_id"})
TIME_COLUMNS = frozenset({
    "scheduled_at", "created_at", "updated_at", "lease_expires_at", "wake_at",
    "cancel_requested_at", "pause_requested_at", "at", "consumed_at", "started_at",
    "last_heartbeat", "stopped_at", "triggered_at", "flagged_at", "end_requested_at",
    "first_seen_at", "last_slot_at", "slot_at", "fired_at",
    "first_seen", "last_seen", "db_now",
})
JSON_COLUMNS = frozenset({"params", "result", "error", "data", "payload", "ffqns",
                          "upgrade_ffqns", "end_request"})


def _us(value: Any) -> int:
    if isinstance(value, datetime):
        return to_us(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _sqlite_param(value: Any) -> Any:
    if isinstance(value, _ops.JsonParam):
        # times inside as this store keeps them: microseconds since the epoch
        return json.dumps(value.value, separators=(",", ":"), ensure_ascii=False,
                          default=_us)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return to_us(value)
    if isinstance(value, timedelta):
        return value // timedelta(microseconds=1)
    if isinstance(value, list | tuple):
        return _dumps([_sqlite_param(v) for v in value])
    if isinstance(value, bool):
        return int(value)
    return value


def _normalise(row: sqlite3.Row) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in row.keys():
        value = row[key]
        if value is not None:
            if key in UUID_COLUMNS:
                value = uuid.UUID(value)
            elif key in TIME_COLUMNS:
                value = from_us(value)
            elif key in JSON_COLUMNS:
                value = read_json(value)
        out[key] = value
    return out


def _split_statements(script: str) -> list[str]:
    """Split a migration into statements (sqlite3 runs one per execute)."""
    statements: list[str] = []
    buf = ""
    for line in script.splitlines(keepends=True):
        if not buf and line.strip().startswith("--"):
            continue
        buf += line
        if sqlite3.complete_statement(buf):
            statements.append(buf.strip())
            buf = ""
    if buf.strip():
        raise ValueError(f"incomplete statement at the end of a migration: {buf[:80]!r}")
    return statements
