"""More faults of workers as real processes (``tests.worker._procs``): a stalled worker
whose only write left is its completion, NOTIFY as the worker's wake-up (not polling), and
a worker started while its database does not answer yet.

Like ``test_processes.py``: ``veracity worker`` subprocesses with short leases against the
test's own database, submissions through the store in this process, and lease recovery
ticked here with ``RecoveryService.run_once()`` where a test needs it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from tests._helpers import get, history, store_fixture
from tests._pg import create_database_from_template, drop_database, with_database
from tests.worker._procs import DEPLOYMENT, Processes, WorkerProcess, wait_until
from tests.workflows import count_marks
from veracity.core.states import Status
from veracity.maintenance.recovery import RecoveryService
from veracity.models import Execution, HistoryEvent, NewExecution
from veracity.store import Store, open_store
from veracity.worker.context import STEP_COMPLETED

ECHO = "test:echo/run.fn"
LAST_WRITE = "test:lastwrite/run.fn"
TTL = 1.5  # the lease TTL of _procs.FAST_ENV


store = store_fixture(pool_size=8)


async def submit(store: Store, ffqn: str, params: list[Any]) -> uuid.UUID:
    """An execution of the worker processes' deployment (tests.worker._procs)."""
    new = NewExecution(ffqn=ffqn, params=params, deployment_id=DEPLOYMENT, id=uuid.uuid4())
    return (await store.execution_submit(new)).execution.id


async def registered(w: WorkerProcess, timeout: float = 15) -> str:
    """Wait until the worker has registered; its worker id."""
    def found() -> str | None:
        assert w.alive, w.describe()
        return w.worker_id()

    wid = await wait_until(found, timeout, what=f"{w.name} to register", describe=w.describe)
    assert wid is not None
    return wid


def records(w: WorkerProcess, message_start: str) -> list[dict[str, Any]]:
    return [r for r in w.log_records() if str(r.get("message", "")).startswith(message_start)]


async def listening(url: str, channel: str) -> int:
    """Connections of this database whose last statement was ``LISTEN channel``."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query ILIKE %s", [f"LISTEN {channel}%"])
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


# -- a stalled worker whose completion is refused ---------------------------------------------


# alone on SQLite: a freeze inside one of A's writes or its recovery tick blocks the others
# until A resumes (a known limit of that backend, docs/workers.md "Recovery"); see
# test_processes.py's stalled-worker test
@pytest.mark.slow(alone="sqlite")
@pytest.mark.timeout(60)
async def test_stalled_workers_completion_is_refused_kept_and_logged(
    database_url: str, store: Store, procs: Processes, tmp_path: Path
) -> None:
    """A is SIGSTOPped after its only step was checkpointed, while the workflow body sleeps
    (plain asyncio.sleep): its completion is the one write it has left. Past its lease,
    recovery and B finish the execution; then A is continued: its completion is refused,
    kept as a ``late_report`` of the completion, and logged; nothing else changes."""
    marks = tmp_path / "marks.txt"
    a = procs.worker(database_url, "A")
    a_id = await registered(a)
    ident = await submit(store, LAST_WRITE, [str(marks), 2.0])
    step_line = f"{ident}:step"

    async def step_checkpointed_by_a() -> bool:
        e = await get(store, ident)
        kinds = [ev.kind for ev in await history(store, ident)]
        return e.lease_owner == a_id and STEP_COMPLETED in kinds

    await wait_until(step_checkpointed_by_a, 10, interval=0.02,
                     what="A to checkpoint its step", describe=a.describe)
    a.stall()  # SIGSTOP during the 2 s sleep of the workflow body
    stalled = await get(store, ident)
    assert stalled.status == Status.RUNNING and stalled.lease_owner == a_id, stalled
    a_epoch = stalled.lease_epoch
    b = procs.worker(database_url, "B")  # idle until the execution is given back
    b_id = await registered(b)

    recovery = RecoveryService(store, max_attempts=5)

    async def retried() -> bool:
        await recovery.run_once()
        return (await get(store, ident)).attempt == 2

    await wait_until(retried, TTL + 5, interval=0.1, what="recovery to retry it",
                     describe=procs.describe)

    async def completed() -> Execution | None:
        e = await get(store, ident)
        return e if e.status == Status.COMPLETED else None

    done = await wait_until(completed, 10, what="B to complete it", describe=procs.describe)
    assert done is not None
    assert done.result == f"completed by pid {b.pid}", done
    assert a.alive, a.describe()
    a.resume()  # SIGCONT: A's sleep is over; it returns and writes its completion

    async def a_late_report() -> list[HistoryEvent]:
        return [ev for ev in await history(store, ident)
                if ev.kind == "late_report" and ev.data.get("owner") == a_id]

    (late,) = await wait_until(a_late_report, 10, what="A's late report", describe=a.describe)
    assert late.data["report"] == "complete", late
    assert late.data["reason"] == "execution is completed", late
    assert late.data["epoch"] == a_epoch, late
    assert late.data["payload"] == {"result": f"completed by pid {a.pid}"}, late

    # the late report changed nothing but the history: B's result and status stand
    after = await get(store, ident)
    assert after.history_seq == done.history_seq + 1
    assert dataclasses.replace(after, history_seq=done.history_seq) == done
    assert after.status == Status.COMPLETED and after.attempt == 2
    events = await history(store, ident)
    kinds = [ev.kind for ev in events]
    assert kinds.count("completed") == 1, kinds
    assert kinds[kinds.index("completed") + 1:] == ["late_report"], kinds
    assert [ev.data["owner"] for ev in events if ev.kind == "running"] == [a_id, b_id]
    assert [ev.kind for ev in events if ev.data.get("owner") == a_id][-1] == "late_report"
    # B replayed the step A had checkpointed: it ran once
    assert count_marks(marks, step_line) == 1

    # the refusal is logged by A, as JSON lines on its stderr: the store's late report
    # and the worker's refused completion, each naming the execution
    def refusal_logged() -> bool:
        return bool(records(a, "completion refused"))

    await wait_until(refusal_logged, 5, what="A to log the refusal", describe=a.describe)
    (refused,) = records(a, "completion refused")
    assert refused["level"] == "warning", refused
    assert refused["execution_id"] == str(ident), refused
    assert "execution is completed" in refused["message"], refused
    (kept,) = records(a, "late report refused")
    assert kept["level"] == "warning" and kept["execution_id"] == str(ident), kept
    assert kept["report"] == "complete" and kept["owner"] == a_id, kept
    assert kept["message"] == "late report refused: execution is completed", kept
    assert "Traceback" not in a.stderr_text()
    assert not records(b, "late report refused") and not records(b, "completion refused")

    assert a.alive, a.describe()
    for w in (a, b):
        w.terminate()
    for w in (a, b):
        assert await w.wait(10) == 0, w.describe()


# -- NOTIFY wakes an idle worker ----------------------------------------------------------------


@pytest.mark.parametrize("notifications", [True, False], ids=["notify-on", "notify-off"])
@pytest.mark.timeout(60)
async def test_notify_wakes_an_idle_worker_long_before_its_next_poll(
    pg_url: str, procs: Processes, notifications: bool
) -> None:
    """A worker polling every 30 s runs each submission within a second or so when it
    listens: the NOTIFY of the submission woke it. With notifications off (the control)
    the same submission waits for the next poll."""
    a = procs.worker(pg_url, "A", env={
        "VERACITY_POLL_INTERVAL": "30",
        "VERACITY_WORKER_NOTIFICATIONS": str(notifications).lower(),
    })
    await registered(a)
    if notifications:
        await wait_until(lambda: listening(pg_url, "veracity_pending"), 10,
                         what="A to LISTEN", describe=a.describe)
    # past A's first claim (right after it registered): the next poll is ~30 s away
    await asyncio.sleep(1.0)
    s = await open_store(pg_url, pool_size=2)
    try:
        if not notifications:
            ident = await submit(s, ECHO, ["unheard"])
            await asyncio.sleep(3.0)
            e = await get(s, ident)
            assert e.status == Status.PENDING and e.lease_owner is None, e
        else:
            latencies = []
            for i in range(3):  # idle between them: each one is a fresh wake-up
                submitted = time.monotonic()
                ident = await submit(s, ECHO, [i])

                async def completed(ident: uuid.UUID = ident) -> bool:
                    return (await get(s, ident)).status == Status.COMPLETED

                await wait_until(completed, 3, interval=0.02,
                                 what=f"submission {i} to complete", describe=a.describe)
                latencies.append(time.monotonic() - submitted)
                assert (await get(s, ident)).result == i
                await asyncio.sleep(0.3)
            print(f"submission to completion: {[f'{x:.3f}s' for x in latencies]}")
    finally:
        await s.close()
    a.terminate()
    assert await a.wait(10) == 0, a.describe()


# -- a database that does not answer yet ----------------------------------------------------------


@pytest.fixture
def later_database(pg_server_url: str, pg_template: str) -> Iterator[tuple[str, str]]:
    """The URL and name of a database that does not exist yet (created by the test)."""
    name = f"veracity_t_{uuid.uuid4().hex}"
    try:
        yield with_database(pg_server_url, name), name
    finally:
        drop_database(pg_server_url, name)


async def set_allow_connections(server_url: str, url: str, allowed: bool) -> None:
    name = conninfo_to_dict(url)["dbname"]
    async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as conn:
        await conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
            sql.Identifier(str(name)), sql.SQL("true" if allowed else "false")))


@pytest.mark.parametrize("how", ["connections-refused", "not-created-yet"])
@pytest.mark.timeout(60)
async def test_worker_started_before_its_database_answers_gets_to_work(
    request: pytest.FixtureRequest, procs: Processes, how: str, pg_server_url: str,
    pg_template: str,
) -> None:
    """The worker starts while its database refuses connections (``ALLOW_CONNECTIONS
    false``) or does not exist yet; it retries, says so once (rate-limited), and once the
    database answers it registers and runs what is submitted."""
    if how == "connections-refused":
        url: str = request.getfixturevalue("pg_url")
        await set_allow_connections(pg_server_url, url, False)
        expected = "not currently accepting connections"
    else:
        url, name = request.getfixturevalue("later_database")
        expected = "does not exist"
    try:
        a = procs.worker(url, "A")

        def retrying() -> list[dict[str, Any]]:
            assert a.alive, a.describe()
            return records(a, "cannot reach the database")

        await wait_until(retrying, 10, what="A to say it cannot reach the database",
                         describe=a.describe)
        await asyncio.sleep(2.5)  # several attempts (backoff from 0.2 s), one message
        assert a.alive and a.worker_id() is None, a.describe()
        said = retrying()
        assert len(said) == 1, a.describe()
        assert said[0]["level"] == "warning", said
        assert expected in said[0]["message"] and "retrying" in said[0]["message"], said
    finally:
        if how == "connections-refused":
            await set_allow_connections(pg_server_url, url, True)
    if how == "not-created-yet":
        await asyncio.to_thread(create_database_from_template, pg_server_url, name,
                                pg_template)

    await registered(a, timeout=15)
    s = await open_store(url, pool_size=2)
    try:
        ident = await submit(s, ECHO, [{"after": how}])

        async def completed() -> Execution | None:
            e = await get(s, ident)
            return e if e.status == Status.COMPLETED else None

        done = await wait_until(completed, 10, what="A to run it", describe=a.describe)
        assert done is not None
        assert done.result == {"after": how} and done.attempt == 1, done
    finally:
        await s.close()
    # the whole outage was said at most twice (once per 10 s), however many attempts
    assert 1 <= len(records(a, "cannot reach the database")) <= 2, a.describe()
    warnings = [r for r in a.log_records() if r.get("level") in ("warning", "error")]
    assert all("cannot reach the database" in r["message"] for r in warnings), warnings
    assert "Traceback" not in a.stderr_text()
    a.terminate()
    assert await a.wait(10) == 0, a.describe()
