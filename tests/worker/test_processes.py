"""Workers as real processes, and the faults docs/workers.md is about (issue 3, item 6).

Every test starts ``veracity worker`` subprocesses against its own fresh database (both
backends unless the fault is PostgreSQL's own) with short leases, submits executions
through the store in this process, and runs lease recovery here by calling
``RecoveryService.run_once()`` in a poll loop (no server needed). Steps that must be
counted across processes append a line to a marks file (``tests.workflows``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import glob
import importlib.util
import sqlite3
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests._helpers import history, store_fixture
from tests._needs import missing
from tests.worker._procs import Processes, WorkerProcess, veracity_bin, wait_until, worker_env
from tests.workflows import count_marks
from veracity._ids import new_execution_id
from veracity.core.states import Status
from veracity.maintenance.recovery import RecoveryService
from veracity.models import Execution, HistoryEvent, NewExecution
from veracity.store import Store, open_store

NOOP = "test:noop/run.fn"
STEPS = "test:steps/run.fn"
FINISH = "test:finish/run.fn"
TTL = 1.5  # the lease TTL of _procs.FAST_ENV
TERMINAL = {Status.COMPLETED, Status.FAILED, Status.FAILED_TRANSIENT, Status.CANCELLED}


# -- fixtures and helpers ---------------------------------------------------------------------


store = store_fixture(pool_size=8)


def is_pg(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


async def query(url: str, pg_sql: str, sqlite_sql: str | None = None,
                params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run one read-only SQL statement on a fresh connection of its own (so it survives
    pg_terminate_backend and never shares a connection with the store under test)."""
    if is_pg(url):
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cur = await conn.execute(pg_sql.encode(), params)
            return await cur.fetchall()
    path = url.removeprefix("sqlite:///")
    text = sqlite_sql if sqlite_sql is not None else pg_sql

    def run() -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
            return conn.execute(text, tuple(params)).fetchall()

    return await asyncio.to_thread(run)


async def status_counts(url: str) -> dict[str, int]:
    rows = await query(url, "SELECT status, count(*) FROM veracity_executions GROUP BY status")
    return {str(s): int(n) for s, n in rows}


async def submit(store: Store, ffqn: str, params: list[Any], n: int = 1,
                 parallel: int = 16) -> list[uuid.UUID]:
    """Submit ``n`` executions straight through the store (durable when this returns)."""
    sem = asyncio.Semaphore(parallel)

    async def one() -> uuid.UUID:
        async with sem:
            done = await store.execution_submit(NewExecution(
                ffqn=ffqn, params=params, deployment_id="d-test", id=new_execution_id()))
            return done.execution.id

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def executions(store: Store, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Execution]:
    out: dict[uuid.UUID, Execution] = {}
    for ident in ids:
        found = await store.execution_get(ident)
        assert found is not None, ident
        out[ident] = found
    return out


async def all_status(store: Store, ids: Sequence[uuid.UUID], status: Status) -> bool:
    return all(e.status == status for e in (await executions(store, ids)).values())


async def recover_until(store: Store, ids: Sequence[uuid.UUID], status: Status,
                        timeout: float, procs: Processes, max_attempts: int = 5) -> None:
    """Tick lease recovery (as ``veracity server`` would, but every 0.1 s) until every
    execution in ``ids`` has ``status``."""
    recovery = RecoveryService(store, max_attempts=max_attempts)

    async def tick() -> bool:
        await recovery.run_once()
        return await all_status(store, ids, status)

    await wait_until(tick, timeout, interval=0.1, what=f"all {len(ids)} to be {status}",
                     describe=procs.describe)


async def registered(*workers: WorkerProcess) -> list[str]:
    """Wait until each worker has registered; their worker ids."""
    ids: list[str] = []
    for w in workers:
        wid = await wait_until(functools.partial(_live_worker_id, w), 15,
                               what=f"{w.name} to register", describe=w.describe)
        assert wid is not None
        ids.append(wid)
    return ids


def _live_worker_id(w: WorkerProcess) -> str | None:
    assert w.alive, w.describe()
    return w.worker_id()


def mark_counts(marks: Path) -> Counter[str]:
    return Counter(marks.read_text().splitlines()) if marks.exists() else Counter()


def marked_at_least(marks: Path, n: int) -> bool:
    return sum(mark_counts(marks).values()) >= n


def warnings_of(w: WorkerProcess) -> list[dict[str, Any]]:
    return [r for r in w.log_records() if r.get("level") in ("warning", "error", "critical")]


# -- 1. competing workers ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_competing_workers_complete_each_execution_exactly_once(
    database_url: str, store: Store, procs: Processes
) -> None:
    # leases long enough that a busy machine cannot make one expire: this test is about
    # claims never handing one execution to two workers, not about lease expiry
    long_leases = {"VERACITY_LEASE_TTL": "30", "VERACITY_HEARTBEAT_INTERVAL": "1"}
    workers = [procs.worker(database_url, env=long_leases) for _ in range(3)]
    worker_ids = await registered(*workers)
    total = 2000
    ids = await submit(store, NOOP, [], n=total)
    assert len(set(ids)) == total

    async def done() -> bool:
        return (await status_counts(database_url)).get("completed", 0) == total

    await wait_until(done, 90, interval=0.2, what=f"{total} completions",
                     describe=procs.describe)
    assert await status_counts(database_url) == {"completed": total}

    per_kind = await query(
        database_url,
        "SELECT kind, count(*), count(DISTINCT execution_id) FROM veracity_history"
        " GROUP BY kind",
    )
    kinds = {str(k): (int(n), int(d)) for k, n, d in per_kind}
    # one pending, one running, one completed event each: no execution was claimed twice,
    # nobody's write was refused, nothing ran twice
    assert kinds == {"pending": (total, total), "running": (total, total),
                     "completed": (total, total)}, kinds
    owners = await query(
        database_url,
        "SELECT data->>'owner', count(*) FROM veracity_history WHERE kind = 'running'"
        " GROUP BY 1",
        "SELECT json_extract(data, '$.owner'), count(*) FROM veracity_history"
        " WHERE kind = 'running' GROUP BY 1",
    )
    ran = {str(o): int(n) for o, n in owners}
    # only our workers ran them, and they competed (on SQLite one of three, polling, can
    # find the queue already drained: sharing among all three is not guaranteed)
    assert set(ran) <= set(worker_ids) and len(ran) >= 2, (ran, worker_ids)
    assert sum(ran.values()) == total
    for w in workers:
        w.terminate()
    for w in workers:
        assert await w.wait(10) == 0, w.describe()


# -- 2. kill -9 in the middle of steps --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_kill9_mid_steps_recovered_from_checkpoints(
    database_url: str, store: Store, procs: Processes, tmp_path: Path
) -> None:
    marks = tmp_path / "marks.txt"
    n_steps = 6
    a = procs.worker(database_url, "A")
    (a_id,) = await registered(a)
    ids = await submit(store, STEPS, [str(marks), n_steps, 0.15], n=10)

    def some_steps_done() -> bool:
        return sum(mark_counts(marks).values()) >= 15

    await wait_until(some_steps_done, 15, what="some steps to run", describe=a.describe)
    a.kill9()
    at_kill = mark_counts(marks)
    assert sum(at_kill.values()) < len(ids) * n_steps, "killed too late: all steps ran"
    interrupted = [i for i, e in (await executions(store, ids)).items()
                   if e.status == Status.RUNNING]
    assert interrupted, "no execution was mid-run when A was killed"

    b = procs.worker(database_url, "B")
    (b_id,) = await registered(b)
    await recover_until(store, ids, Status.COMPLETED, 30, procs)

    final = await executions(store, ids)
    counts = mark_counts(marks)
    for ident, e in final.items():
        lines = [f"{ident}:{i}" for i in range(n_steps)]
        assert e.result == lines
        repeated = [line for line in lines if counts[line] != 1]
        # only the step in flight at the kill (ran, checkpoint never committed) may repeat
        assert len(repeated) <= 1, (ident, {line: counts[line] for line in lines})
        assert all(counts[line] == 2 for line in repeated), counts
    assert not set(counts) - {f"{i}:{s}" for i in ids for s in range(n_steps)}
    print(f"killed A after {sum(at_kill.values())} steps; {len(interrupted)} recovered; "
          f"{sum(n - 1 for n in counts.values())} steps ran twice")

    for ident in interrupted:
        e = final[ident]
        assert e.attempt == 2, e
        events = await history(store, ident)
        kinds = [ev.kind for ev in events]
        assert kinds.count("completed") == 1
        expired = [ev for ev in events if ev.kind == "pending"
                   and ev.data.get("reason") == "lease expired"]
        assert len(expired) == 1 and expired[0].data["owner"] == a_id, events
        runners = [ev.data["owner"] for ev in events if ev.kind == "running"]
        assert runners == [a_id, b_id]
        # the steps A checkpointed before dying were replayed by B, not run again; only the
        # step after them (in flight at the kill) may have run twice
        before = events[: events.index(expired[0])]
        done_by_a = sorted(ev.data["pos"] for ev in before if ev.kind == "step_completed")
        assert done_by_a == list(range(len(done_by_a))), before
        assert all(counts[f"{ident}:{pos}"] == 1 for pos in done_by_a), counts
        for pos in range(len(done_by_a) + 1, n_steps):
            assert counts[f"{ident}:{pos}"] == 1, counts
        assert sum(at_kill[f"{ident}:{pos}"] for pos in range(n_steps)) >= len(done_by_a)
    b.terminate()
    assert await b.wait(10) == 0, b.describe()


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_workers_recover_a_killed_worker_s_executions_without_a_server(
    database_url: str, store: Store, procs: Processes, tmp_path: Path
) -> None:
    """Lease recovery runs in every worker (one runner at a time, by its lock): with no
    server anywhere, a worker recovers the executions of a worker killed with -9."""
    marks = tmp_path / "marks.txt"
    fast_recovery = {"VERACITY_RECOVERY_INTERVAL": "0.3"}
    a = procs.worker(database_url, "A", env=fast_recovery)
    (a_id,) = await registered(a)
    ids = await submit(store, STEPS, [str(marks), 4, 0.2], n=4)
    await wait_until(lambda: sum(mark_counts(marks).values()) >= 2, 15,
                     what="some steps to run", describe=a.describe)
    a.kill9()
    b = procs.worker(database_url, "B", env=fast_recovery)
    c = procs.worker(database_url, "C", env=fast_recovery)
    await registered(b, c)

    await wait_until(functools.partial(all_status, store, ids, Status.COMPLETED), 30,
                     what="every execution completed", describe=procs.describe)
    recovered = 0
    for ident in ids:
        events = await history(store, ident)
        expired = [ev for ev in events if ev.data and ev.data.get("reason") == "lease expired"]
        recovered += len(expired)
        assert all(ev.data["owner"] == a_id for ev in expired), events
        assert [ev.kind for ev in events].count("completed") == 1
    assert recovered >= 1, "nothing was recovered from the killed worker"
    for w in (b, c):
        w.terminate()
        assert await w.wait(10) == 0, w.describe()


# -- 3. a stalled worker ----------------------------------------------------------------------


# alone on SQLite: A is frozen at a random moment, and on a loaded machine that can be inside
# one of A's writes or its recovery tick, whose locks (SQLite's write lock, the tick's file
# lock) A then holds until it resumes: every other process waits meanwhile (a known limit of
# that backend, docs/workers.md "Recovery"). On PostgreSQL the recovery lock's session ends
# once silent for 3 s, and A holds no lock a write of the others waits on.
@pytest.mark.slow(alone="sqlite")
@pytest.mark.timeout(60)
async def test_stalled_worker_is_fenced_out_and_its_report_kept(
    database_url: str, store: Store, procs: Processes, tmp_path: Path
) -> None:
    marks = tmp_path / "marks.txt"
    a = procs.worker(database_url, "A")
    (a_id,) = await registered(a)
    (ident,) = await submit(store, FINISH, [str(marks), 1.0])
    step_line = f"{ident}:step"

    async def running_on_a() -> bool:
        e = await store.execution_get(ident)
        return e is not None and e.status == Status.RUNNING and e.lease_owner == a_id

    await wait_until(running_on_a, 10, interval=0.02, what="A to claim it",
                     describe=a.describe)
    a.stall()  # SIGSTOP while its one-second step runs
    assert count_marks(marks, step_line) == 0, "A finished its step before it was stopped"

    async def lease_over() -> bool:
        e = await store.execution_get(ident)
        assert e is not None and e.lease_expires_at is not None
        return await store.db_now() > e.lease_expires_at

    await wait_until(lease_over, TTL + 3, what="A's lease to expire")
    await recover_until(store, [ident], Status.PENDING, 5, procs)

    b = procs.worker(database_url, "B")
    (b_id,) = await registered(b)

    async def completed() -> bool:
        return await all_status(store, [ident], Status.COMPLETED)

    await wait_until(completed, 10, what="B to complete it", describe=procs.describe)
    a.resume()  # SIGCONT: A's step finishes and tries to checkpoint under its dead lease

    async def late_report() -> list[HistoryEvent]:
        return [ev for ev in await history(store, ident)
                if ev.kind == "late_report" and ev.data.get("owner") == a_id]

    (late,) = await wait_until(late_report, 10, what="A's late report", describe=a.describe)
    assert late.data["reason"] == "execution is completed", late
    e = await store.execution_get(ident)
    assert e is not None and e.status == Status.COMPLETED
    assert e.result == f"done by pid {b.pid}"
    assert e.attempt == 2
    events = await history(store, ident)
    assert [ev.kind for ev in events].count("completed") == 1
    assert [ev.data["owner"] for ev in events if ev.kind == "running"] == [a_id, b_id]
    # both ran the step: A's run happened, but its outcome was fenced out
    await wait_until(lambda: count_marks(marks, step_line) == 2, 5, what="A's mark")
    assert a.alive, a.describe()
    for w in (a, b):
        w.terminate()
    for w in (a, b):
        assert await w.wait(10) == 0, w.describe()


# -- 4. the worker's database connections killed ----------------------------------------------


async def terminate_other_backends(url: str) -> int:
    """pg_terminate_backend on every other connection to this test's database (the
    worker's pool and its LISTEN connection); how many were terminated."""
    rows = await query(
        url,
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    return int(rows[0][0])


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_worker_survives_pg_terminate_backend(
    pg_url: str, procs: Processes, tmp_path: Path
) -> None:
    marks = tmp_path / "marks.txt"
    n_steps = 6
    a = procs.worker(pg_url, "A", env={"VERACITY_LEASE_TTL": "5",
                                       "VERACITY_HEARTBEAT_INTERVAL": "0.3"})
    await registered(a)
    async with contextlib.AsyncExitStack() as stack:
        s = await open_store(pg_url, pool_size=4)
        stack.push_async_callback(s.close)
        ids = await submit(s, STEPS, [str(marks), n_steps, 0.15], n=10)
    killed = 0
    await wait_until(functools.partial(marked_at_least, marks, 10), 20,
                     what="10 steps", describe=a.describe)
    # a second of terminations every 50 ms: idle pooled connections, statements in flight,
    # the LISTEN connection, and the reconnections themselves
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        killed += await terminate_other_backends(pg_url)
        await asyncio.sleep(0.05)
    assert killed >= 3

    async def done() -> bool:
        return (await status_counts(pg_url)).get("completed", 0) == len(ids)

    # no recovery runs here: the worker must reconnect and finish them itself, within
    # their leases
    await wait_until(done, 30, interval=0.1, what="all to complete", describe=a.describe)
    assert a.alive, a.describe()
    rows = await query(pg_url, "SELECT id, status, attempt, result FROM veracity_executions")
    counts = mark_counts(marks)
    for ident, status, attempt, result in rows:
        assert (status, attempt) == ("completed", 1), (ident, status, attempt)
        lines = [f"{ident}:{i}" for i in range(n_steps)]
        assert result == lines
        # a checkpoint whose commit was lost with its connection may repeat one step
        assert sum(counts[line] - 1 for line in lines) <= 1, counts
    a.terminate()
    assert await a.wait(10) == 0, a.describe()


# -- 5. a lost NOTIFY -------------------------------------------------------------------------


@pytest.mark.parametrize("notifications", [False, True], ids=["notify-off", "notify-on"])
@pytest.mark.timeout(60)
async def test_polling_runs_what_notifications_would_have(
    pg_url: str, procs: Processes, notifications: bool
) -> None:
    a = procs.worker(pg_url, "A", env={
        "VERACITY_WORKER_NOTIFICATIONS": str(notifications).lower(),
        "VERACITY_POLL_INTERVAL": "0.3",
    })
    await registered(a)

    async def listeners() -> int:
        rows = await query(
            pg_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query ILIKE 'LISTEN%%'",
        )
        return int(rows[0][0])

    if notifications:
        await wait_until(listeners, 10, what="the worker to LISTEN", describe=a.describe)
    s = await open_store(pg_url, pool_size=4)
    try:
        ids: list[uuid.UUID] = []
        for _ in range(5):  # a few trickling in after the worker went idle
            ids += await submit(s, NOOP, [], n=4)
            await asyncio.sleep(0.1)
        if not notifications:
            # every NOTIFY of these submissions went to nobody: no connection listens
            assert await listeners() == 0

        async def done() -> bool:
            return await all_status(s, ids, Status.COMPLETED)

        await wait_until(done, 15, what="polling to run them all", describe=a.describe)
    finally:
        await s.close()
    a.terminate()
    assert await a.wait(10) == 0, a.describe()


# -- 6. the database clock --------------------------------------------------------------------

def find_libfaketime() -> str | None:
    """libfaketime's preload library: the one the ``libfaketime`` package (a development
    dependency) builds, else the Debian/Ubuntu package ``faketime``'s. It is preloaded into
    the worker directly, not through the ``faketime`` wrapper, whose kill -9 would leave
    the real worker running."""
    spec = importlib.util.find_spec("libfaketime")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "vendor" / "libfaketime" / "src" / "libfaketime.so.1"
        if bundled.is_file():
            return str(bundled)
    for pattern in ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib*/faketime/libfaketime.so.1",
                    "/usr/local/lib*/faketime/libfaketime.so.1"):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


LIBFAKETIME = find_libfaketime()


@pytest.mark.parametrize("skew", ["tz", "-2d", "+2d"])
@pytest.mark.timeout(60)
async def test_leases_follow_the_database_clock(
    pg_url: str, procs: Processes, tmp_path: Path, skew: str
) -> None:
    """A worker whose local clock is far off leases by the database's clock.

    What this proves: with libfaketime preloaded (the ``libfaketime`` development
    dependency or Debian's ``faketime``; failing, saying so, where neither is installed) the
    worker's wall clock is two days behind or ahead, for Python and its C libraries alike
    (the test checks its log timestamps);
    every lease it takes and renews still ends TTL after the database's ``now()``; its
    fenced writes are accepted (a lease computed from a clock 2 days behind would be over
    at once, and every write refused); and after kill -9, recovery takes the execution
    back about TTL later (a lease computed from a clock 2 days ahead would hold it for two
    days). The ``tz`` case runs the worker in UTC+14 (TZ=Pacific/Kiritimati) without
    faketime: that proves only that no local-time conversion leaks into lease arithmetic.

    What it cannot prove: anything about the database server's own clock (the one every
    lease is measured by, by design), or a local clock that jumps while the worker runs
    (its monotonic clock is left alone here; the worker's local lease estimates use it).
    """
    env = {"TZ": "Pacific/Kiritimati"}
    if skew != "tz":
        if LIBFAKETIME is None:
            missing("libfaketime is not installed (pip install libfaketime, or apt-get install "
                    "faketime)")
        # only the wall clock is off, as on a machine whose clock is wrong
        env.update({"LD_PRELOAD": LIBFAKETIME, "FAKETIME": skew,
                    "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
    marks = tmp_path / "marks.txt"
    a = procs.worker(pg_url, "A", env=env)
    await registered(a)
    if skew != "tz":  # the skew is real: the worker's clock is ~2 days off the database's
        started = next(r for r in a.log_records() if r.get("message") == "worker started")
        s0 = await open_store(pg_url, pool_size=2)
        try:
            db_now = await s0.db_now()
        finally:
            await s0.close()
        skew_seconds = (datetime.fromisoformat(started["at"]) - db_now).total_seconds()
        assert abs(abs(skew_seconds) - 2 * 86400) < 60, skew_seconds

    s = await open_store(pg_url, pool_size=4)
    try:
        recovery = RecoveryService(s, max_attempts=5)
        # a run longer than its TTL: it lives on renewals
        (long_run,) = await submit(s, STEPS, [str(marks), 4, 0.5])
        samples: list[float] = []
        passes: list[bool] = []  # whether each pass ran: the worker runs recovery too, and a
        # pass of ours that meets the worker's holding the lock is skipped (docs/workers.md)

        async def sample() -> bool:
            result = await recovery.run_once()
            assert not result.retried and not result.failed, result
            passes.append(result.ran)
            e = await s.execution_get(long_run)
            assert e is not None
            if e.status == Status.RUNNING and e.lease_expires_at is not None:
                rows = await query(pg_url, "SELECT %s::timestamptz - now()",
                                   params=[e.lease_expires_at])
                samples.append(rows[0][0].total_seconds())
            return e.status in TERMINAL

        await wait_until(sample, 20, interval=0.1, what="the long run to end",
                         describe=a.describe)
        e = await s.execution_get(long_run)
        assert e is not None and e.status == Status.COMPLETED and e.attempt == 1, e
        assert len(samples) >= 8, samples
        assert passes.count(True) >= len(passes) // 2, passes  # recovery did look, and let it be
        # expires_at - now() by the database: TTL right after a renewal, never less than
        # TTL minus one heartbeat interval (0.3 s) and the sampling delay
        assert all(TTL - 0.8 <= x <= TTL + 0.1 for x in samples), samples
        kinds = [ev.kind for ev in await history(s, long_run)]
        assert "late_report" not in kinds and kinds.count("running") == 1, kinds

        # kill -9 while it holds a lease: recovery takes it back ~TTL later (DB clock)
        (held,) = await submit(s, FINISH, [str(marks), 5.0])

        async def claimed() -> Execution | None:
            x = await s.execution_get(held)
            return x if x is not None and x.status == Status.RUNNING else None

        await wait_until(claimed, 10, what="A to claim", describe=a.describe)
        a.kill9()
        killed_at = time.monotonic()
        await recover_until(s, [held], Status.PENDING, TTL + 3, procs)
        assert time.monotonic() - killed_at < TTL + 2
    finally:
        await s.close()


# -- 7. SIGTERM with steps in flight ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_sigterm_releases_in_flight_executions_at_once(
    database_url: str, store: Store, procs: Processes, tmp_path: Path
) -> None:
    marks = tmp_path / "marks.txt"
    n_steps = 6
    # a long TTL: anything back to pending within seconds was released, not recovered
    a = procs.worker(database_url, "A", env={"VERACITY_LEASE_TTL": "60",
                                              "VERACITY_SHUTDOWN_GRACE": "5"})
    (a_id,) = await registered(a)
    ids = await submit(store, STEPS, [str(marks), n_steps, 0.3], n=6)
    await wait_until(lambda: sum(mark_counts(marks).values()) >= 6, 15,
                     what="some steps to run", describe=a.describe)
    a.terminate()
    sent = time.monotonic()
    assert await a.wait(10) == 0, a.describe()
    took = time.monotonic() - sent
    assert took < 3, f"shutdown took {took:.1f}s"

    now = await executions(store, ids)
    released = [i for i, e in now.items() if e.status != Status.COMPLETED]
    assert released, "every execution finished before SIGTERM"
    for ident in released:
        e = now[ident]
        assert e.status == Status.PENDING and e.lease_owner is None, e
        last = (await history(store, ident))[-1]
        assert last.kind == "pending", last
        assert last.data.get("reason") == "worker shutting down", last
        assert last.data.get("owner") == a_id, last
    before = mark_counts(marks)
    assert sum(before.values()) < len(ids) * n_steps

    b = procs.worker(database_url, "B")
    await registered(b)

    async def done() -> bool:
        return await all_status(store, ids, Status.COMPLETED)

    await wait_until(done, 20, what="B to finish them", describe=procs.describe)
    counts = mark_counts(marks)
    for ident, e in (await executions(store, ids)).items():
        lines = [f"{ident}:{i}" for i in range(n_steps)]
        assert e.result == lines
        # the drain let in-flight steps finish and checkpoint: nothing ran twice
        assert all(counts[line] == 1 for line in lines), {x: counts[x] for x in lines}
    b.terminate()
    assert await b.wait(10) == 0, b.describe()


# -- 8. bad input -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
async def test_bad_input_unrunnable_and_failing_workflows(
    database_url: str, store: Store, procs: Processes
) -> None:
    a = procs.worker(database_url, "A")
    await registered(a)
    (orphan,) = await submit(store, "test:nobody/run.fn", [])
    failing = {
        "test:raise/run.fn": "workflow_error",
        "test:fail/run.fn": "workflow_error",
        "test:timeout/run.fn": "timeout",
        "test:notjson/run.fn": "result_not_json",
    }
    ids = {ffqn: (await submit(store, ffqn, []))[0] for ffqn in failing}
    (ok,) = await submit(store, NOOP, [])

    async def settled() -> bool:
        got = await executions(store, [*ids.values(), ok])
        return all(e.status in TERMINAL for e in got.values())

    await wait_until(settled, 15, what="the failing workflows to end", describe=a.describe)
    for ffqn, code in failing.items():
        e = await store.execution_get(ids[ffqn])
        assert e is not None and e.status == Status.FAILED, e
        assert isinstance(e.error, dict) and e.error.get("code") == code, (ffqn, e.error)
        assert e.error.get("message"), e.error
    assert (await store.execution_get(ok)) is not None

    await asyncio.sleep(0.5)  # a few more polls of the worker: it still leaves it alone
    e = await store.execution_get(orphan)
    assert e is not None and e.status == Status.PENDING and e.lease_owner is None, e
    env = worker_env(database_url)
    del env["VERACITY_APP"]
    listing = await asyncio.to_thread(
        subprocess.run, [veracity_bin(), "list"], env=env, capture_output=True, text=True,
        timeout=30, check=False)
    assert listing.returncode == 0, listing.stderr
    row = next(line for line in listing.stdout.splitlines() if str(orphan) in line)
    assert "no live worker runs test:nobody/run.fn" in row, listing.stdout
    ok_row = next(line for line in listing.stdout.splitlines() if str(ok) in line)
    assert "no live worker" not in ok_row
    a.terminate()
    assert await a.wait(10) == 0, a.describe()


@pytest.mark.timeout(30)
async def test_worker_with_unreachable_database_retries_quietly(procs: Processes) -> None:
    a = procs.worker("postgresql://postgres@127.0.0.1:1/x", "A")
    await asyncio.sleep(3)
    assert a.alive, a.describe()
    said = warnings_of(a)
    assert 1 <= len(said) <= 2, a.describe()
    assert "127.0.0.1:1" in said[0]["message"] or "database" in said[0]["message"], said
    a.terminate()
    assert await a.wait(10) == 0, a.describe()


# -- 9. a transient database error in a checkpoint --------------------------------------------


@pytest.mark.timeout(60)
async def test_transient_database_error_in_a_checkpoint_does_not_fail_the_execution(
    pg_url: str, procs: Processes, tmp_path: Path
) -> None:
    """A statement of the worker cancelled by the database (here: a statement_timeout hit
    while another transaction holds the execution's row) is infrastructure trouble, not
    the workflow's own error: the execution may be retried or recovered, but must not end
    ``failed`` (docs/states.md: failed is "the workflow's own error after its retries")."""
    marks = tmp_path / "marks.txt"
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        dbname = conn.info.dbname
        await conn.execute(
            sql.SQL("ALTER DATABASE {} SET statement_timeout = '300ms'").format(
                sql.Identifier(dbname)))
    a = procs.worker(pg_url, "A", env={"VERACITY_LEASE_TTL": "3"})
    await registered(a)
    s = await open_store(pg_url, pool_size=4)
    try:
        (ident,) = await submit(s, STEPS, [str(marks), 3, 0.3])

        async def running() -> bool:
            return await all_status(s, [ident], Status.RUNNING)

        await wait_until(running, 10, interval=0.02, what="A to claim", describe=a.describe)
        # hold the row across the first checkpoint (due ~0.3 s after the claim)
        async with await psycopg.AsyncConnection.connect(pg_url) as locker:
            await locker.execute(
                "SELECT 1 FROM veracity_executions WHERE id = %s FOR UPDATE", [ident])
            await asyncio.sleep(1.2)
            await locker.rollback()
        recovery = RecoveryService(s, max_attempts=5)

        async def settled() -> Execution | None:
            await recovery.run_once()
            e = await s.execution_get(ident)
            return e if e is not None and e.status in TERMINAL else None

        e = await wait_until(settled, 30, interval=0.2, what="it to end", describe=a.describe)
        assert e is not None
        assert e.status == Status.COMPLETED, (e.status, e.error)
        assert e.result == [f"{ident}:{i}" for i in range(3)]
    finally:
        await s.close()
