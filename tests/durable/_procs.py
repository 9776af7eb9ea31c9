"""Real worker processes for the durable-engine crash tests.

The process machinery is ``tests.worker._procs`` (imported, not copied); this module adds
what the crash tests need on top of it:

- ``parents_app``: an App with only the *parent* workflows of ``tests.workflows``. A
  ``veracity worker`` started with ``VERACITY_APP=tests.durable._procs:parents_app`` claims
  parents but never their children, so a parent reliably ends up blocked on its join set
  with its children still pending (the claim filters by workflow name only).
- ``hold_after_child`` / ``hold_writes``: a fault injected in the database (a trigger) that
  refuses an execution's next write of some kinds, e.g. the parent's block or ``join_next``
  after it created a child: the worker keeps retrying that write under a valid lease, so a
  kill -9 lands exactly between a child's creation and the parent's next step, on every
  run and both backends.
- ``sql``: one statement on a fresh connection of its own (never the store under test).
- ``Recovery``: lease recovery ticked from the test process, remembering what it touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg

from tests import workflows as wf
from tests.worker._procs import Processes, WorkerProcess, wait_until
from veracity import App
from veracity.maintenance.recovery import RecoveryService
from veracity.store import Store

__all__ = [
    "ENGINE_ENV", "PARENTS_APP", "Processes", "Recovery", "WorkerProcess", "hold_after_child",
    "hold_writes", "is_pg", "parents_app", "registered", "release_hold", "sql", "wait_until",
]

# tests.worker._procs.FAST_ENV has TTL 1.5 s and heartbeat 0.3 s; poll faster here
ENGINE_ENV: dict[str, str] = {"VERACITY_POLL_INTERVAL": "0.1"}
PARENTS_APP = "tests.durable._procs:parents_app"

parents_app = App("tests-parents-only")
"""The workflows of ``tests.workflows`` that create children, and nothing else."""
parents_app.workflow("test:parent/run.fn")(wf.parent)
parents_app.workflow("test:call/run.fn")(wf.caller)
parents_app.workflow("test:top/top.run-cancellable")(wf.top)


def is_pg(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


async def sql(url: str, pg_sql: str, sqlite_sql: str,
              params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run one statement (``%s`` placeholders for PostgreSQL, ``?`` for SQLite; UUIDs are
    passed as text on SQLite) on a fresh autocommit connection of its own."""
    if is_pg(url):
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cur = await conn.execute(pg_sql.encode(), params or None)
            return await cur.fetchall() if cur.description is not None else []
    path = url.removeprefix("sqlite:///")
    args = tuple(str(p) if isinstance(p, uuid.UUID) else p for p in params)

    def run() -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
            cur = conn.execute(sqlite_sql, args)
            rows = cur.fetchall()
            conn.commit()
            return rows

    return await asyncio.to_thread(run)


# -- fault injection: hold an execution's next write ---------------------------------------

HOLD = "veracity_test_hold"
HOLD_MESSAGE = "test fault: this write is held by the test"


AFTER_CHILD = ("blocked", "join_next")
"""What a parent writes next after creating its child (its block writes ``blocked``, or
``pending`` if signalled meanwhile: see ``hold_writes``)."""


async def hold_after_child(url: str, parent_id: uuid.UUID) -> None:
    """Refuse the parent's next journal write after a child's creation: its ``join_next``,
    and the ``blocked`` (or, if signalled meanwhile, ``pending``) event its block writes."""
    await hold_writes(url, parent_id, AFTER_CHILD, owned_pending=True)


async def hold_writes(url: str, execution_id: uuid.UUID, kinds: Sequence[str], *,
                      owned_pending: bool = False) -> None:
    """A database fault: every history event of ``execution_id`` of one of ``kinds`` is
    refused (the whole transaction fails; the worker retries it while its lease is valid).
    With ``owned_pending``, also the ``pending`` events a worker writes itself (they carry
    an ``owner``: a block that was signalled meanwhile, a release); the ``pending`` event of
    a child's end waking the parent carries none and is let through. Install before any
    worker runs the execution; one hold per database."""
    names = ", ".join("'" + k.replace("'", "''") + "'" for k in kinds)
    if is_pg(url):
        pending = "OR (NEW.kind = 'pending' AND (NEW.data->>'owner') IS NOT NULL)"
        await sql(url, f"""
            CREATE FUNCTION {HOLD}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION '{HOLD_MESSAGE.replace("'", "''")}';
            END
            $$""", "")
        await sql(url, f"""
            CREATE TRIGGER {HOLD} BEFORE INSERT ON veracity_history FOR EACH ROW
            WHEN (NEW.execution_id = '{execution_id}'::uuid
                  AND (NEW.kind IN ({names}) {pending if owned_pending else ""}))
            EXECUTE FUNCTION {HOLD}()""", "")
        return
    pending = "OR (NEW.kind = 'pending' AND json_extract(NEW.data, '$.owner') IS NOT NULL)"
    await sql(url, "", f"""
        CREATE TRIGGER {HOLD} BEFORE INSERT ON veracity_history
        WHEN NEW.execution_id = '{execution_id}'
         AND (NEW.kind IN ({names}) {pending if owned_pending else ""})
        BEGIN
            SELECT RAISE(ABORT, '{HOLD_MESSAGE.replace("'", "''")}');
        END""")


async def release_hold(url: str) -> None:
    if is_pg(url):
        await sql(url, f"DROP TRIGGER IF EXISTS {HOLD} ON veracity_history", "")
        await sql(url, f"DROP FUNCTION IF EXISTS {HOLD}()", "")
        return
    await sql(url, "", f"DROP TRIGGER IF EXISTS {HOLD}")


# -- workers and recovery ---------------------------------------------------------------------


async def registered(*workers: WorkerProcess, timeout: float = 20.0) -> list[str]:
    """Wait until each worker has registered (logged its id); their worker ids."""
    ids: list[str] = []
    for w in workers:
        found = await wait_until(functools.partial(_live_worker_id, w), timeout,
                                 what=f"{w.name} to register", describe=w.describe)
        assert found is not None
        ids.append(found)
    return ids


def _live_worker_id(w: WorkerProcess) -> str | None:
    assert w.alive, f"{w.name} exited\n{w.describe()}"
    return w.worker_id()


class Recovery:
    """``RecoveryService.run_once()`` ticked from the test process (as ``veracity server``
    would, but every 0.1 s), remembering every execution it retried or failed."""

    def __init__(self, store: Store, procs: Processes, max_attempts: int = 5) -> None:
        self.service = RecoveryService(store, max_attempts=max_attempts)
        self.procs = procs
        self.retried: list[str] = []
        self.failed: list[str] = []
        self.ticks = 0

    async def tick(self) -> None:
        result = await self.service.run_once()
        self.ticks += 1
        self.retried.extend(result.retried)
        self.failed.extend(result.failed)

    def touched(self, execution_id: uuid.UUID) -> bool:
        return str(execution_id) in self.retried or str(execution_id) in self.failed

    async def until(self, check: Callable[[], Awaitable[Any]], timeout: float,
                    what: str) -> Any:
        """Tick recovery and poll ``check`` every 0.1 s until it returns something truthy."""
        async def ticked() -> Any:
            await self.tick()
            return await check()

        return await wait_until(ticked, timeout, interval=0.1, what=what,
                                describe=self.procs.describe)
