"""Helpers for the store conformance suite (no fixtures here; see ``conftest.py``).

* :class:`RawSQL` reaches past the store to the database itself: for fault injection
  (a trigger that makes history inserts fail) and to check what the schema enforces.
* :func:`assert_history_consistent` checks docs/states.md's guarantee 7 after any operation: history
  sequence numbers are 1..n without gaps and the newest state event names the status.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, LiteralString

import psycopg

from tests._helpers import get as get
from veracity.core.states import Status
from veracity.models import Claim, Execution, HistoryEvent, NewExecution
from veracity.store import Store

# open_extra_store: opens another store instance on the test's database
StoreFactory = Callable[..., Awaitable[Store]]

# What a statement refused by the database raises, whichever the backend.
DB_ERRORS: tuple[type[Exception], ...] = (psycopg.Error, sqlite3.Error)

# History kinds that record a state change; anything else (late_report) is not one.
STATE_KINDS = frozenset(str(s) for s in Status)


def new_execution(
    ffqn: str = "app.orders.create",
    params: list[Any] | None = None,
    *,
    deployment_id: str = "dep-1",
    idempotency_key: str | None = None,
    request_digest: str | None = None,
    scheduled_at: datetime | None = None,
    parent_id: uuid.UUID | None = None,
) -> NewExecution:
    return NewExecution(
        ffqn=ffqn,
        params=params if params is not None else [],
        deployment_id=deployment_id,
        id=uuid.uuid4(),
        idempotency_key=idempotency_key,
        request_digest=request_digest,
        scheduled_at=scheduled_at,
        parent_id=parent_id,
    )


async def assert_history_consistent(store: Store, execution_id: uuid.UUID) -> list[HistoryEvent]:
    """Seqs are exactly 1..n (n = the execution's ``history_seq``), the first event is
    ``pending``, and the newest state event's kind equals the execution's status, with its
    time equal to ``updated_at``."""
    execution = await store.execution_get(execution_id)
    assert execution is not None
    events = await store.history_list(execution_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert execution.history_seq == len(events)
    assert all(e.execution_id == execution_id for e in events)
    assert events[0].kind == "pending"
    state_events = [e for e in events if e.kind in STATE_KINDS]
    assert state_events[-1].kind == str(execution.status)
    assert state_events[-1].at == execution.updated_at
    return events


class RawSQL:
    """Plain SQL on a store's database, outside the store (psycopg or sqlite3).

    Statements use ``?`` placeholders; for PostgreSQL they become ``%s``.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.backend = "sqlite" if url.startswith("sqlite:///") else "postgresql"

    def execute(
        self, statement: LiteralString, params: Sequence[Any] = ()
    ) -> list[tuple[Any, ...]]:
        if self.backend == "postgresql":
            with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
                cur = conn.execute(statement.replace("?", "%s"), tuple(params) or None)
                return cur.fetchall() if cur.description is not None else []
        path = self.url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path, timeout=30, isolation_level=None)) as conn:
            return conn.execute(statement, tuple(params)).fetchall()

    def scalar(self, statement: LiteralString, params: Sequence[Any] = ()) -> Any:
        rows = self.execute(statement, params)
        assert len(rows) == 1, rows
        return rows[0][0]

    def migration_versions(self) -> list[int]:
        rows = self.execute("SELECT version FROM veracity_migrations ORDER BY version")
        return [int(r[0]) for r in rows]

    @contextlib.contextmanager
    def writer_holding_a_transaction(self) -> Iterator[None]:
        """While inside, another connection holds an open write transaction (as another
        process that is in the middle of writing, e.g. migrating, would)."""
        if self.backend == "postgresql":
            with psycopg.connect(self.url, connect_timeout=10) as pg:
                pg.execute("CREATE TABLE veracity_test_writer (x integer)")
                yield
                pg.rollback()
            return
        path = self.url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path, timeout=30, isolation_level=None)) as lite:
            lite.execute("BEGIN IMMEDIATE")
            lite.execute("CREATE TABLE veracity_test_writer (x INTEGER)")
            yield
            lite.execute("ROLLBACK")

    @contextlib.contextmanager
    def history_insert_fails(self) -> Iterator[None]:
        """While inside, every INSERT into veracity_history raises ``boom``."""
        if self.backend == "postgresql":
            self.execute(
                "CREATE FUNCTION veracity_test_boom() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'boom'; END $$"
            )
            self.execute(
                "CREATE TRIGGER veracity_test_boom BEFORE INSERT ON veracity_history "
                "FOR EACH ROW EXECUTE FUNCTION veracity_test_boom()"
            )
        else:
            self.execute(
                "CREATE TRIGGER veracity_test_boom BEFORE INSERT ON veracity_history "
                "BEGIN SELECT RAISE(ABORT, 'boom'); END"
            )
        try:
            yield
        finally:
            if self.backend == "postgresql":
                self.execute("DROP TRIGGER veracity_test_boom ON veracity_history")
                self.execute("DROP FUNCTION veracity_test_boom()")
            else:
                self.execute("DROP TRIGGER veracity_test_boom")


# -- the durable engine (blocking waits, children, messages, cancel, pause) -----------------

ENGINE_TTL = timedelta(seconds=30)


def unique_ffqn(*, cancellable: bool = False) -> str:
    """A workflow name of its own, so that a claim takes exactly one chosen execution."""
    name = f"app.t{uuid.uuid4().hex[:12]}.run"
    return f"{name}-cancellable" if cancellable else name


def new_child(
    parent_id: uuid.UUID | None,
    *,
    cancellable: bool = False,
    join_set: str | None = "js0",
    params: list[Any] | None = None,
    deployment_id: str = "dep-1",
    scheduled_at: datetime | None = None,
) -> NewExecution:
    """What a workflow asks to spawn: a child of ``parent_id`` (None: a top-level one)."""
    return NewExecution(
        ffqn=unique_ffqn(cancellable=cancellable),
        params=params if params is not None else [],
        deployment_id=deployment_id,
        id=uuid.uuid4(),
        parent_id=parent_id,
        join_set=join_set if parent_id is not None else None,
        scheduled_at=scheduled_at,
    )


async def submit_unique(
    store: Store, *, cancellable: bool = False, paused: bool = False, **kw: Any
) -> Execution:
    new = dataclasses.replace(
        new_execution(unique_ffqn(cancellable=cancellable), **kw), paused=paused
    )
    return (await store.execution_submit(new)).execution


async def claim_exactly(
    store: Store, execution_id: uuid.UUID, owner: str = "worker-a",
    ttl: timedelta = ENGINE_TTL,
) -> Claim:
    """Claim the one execution ``execution_id`` (its workflow name is unique to it)."""
    ex = await store.execution_get(execution_id)
    assert ex is not None
    claimed = await store.execution_claim(owner, [ex.ffqn], limit=10, lease_ttl=ttl)
    assert [c.id for c in claimed] == [execution_id], claimed
    return Claim(execution_id, owner, claimed[0].lease_epoch)


async def assert_history_intact(
    store: Store, execution_id: uuid.UUID, *, first: str = "pending"
) -> list[HistoryEvent]:
    """:func:`assert_history_consistent` for executions whose first event may be another
    state (``paused`` for one submitted on hold)."""
    if first == "pending":
        return await assert_history_consistent(store, execution_id)
    execution = await get(store, execution_id)
    events = await store.history_list(execution_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert execution.history_seq == len(events)
    assert events[0].kind == first
    state_events = [e for e in events if e.kind in STATE_KINDS]
    assert state_events[-1].kind == str(execution.status)
    assert state_events[-1].at == execution.updated_at
    return events


def kinds(events: Sequence[HistoryEvent]) -> list[str]:
    return [e.kind for e in events]
