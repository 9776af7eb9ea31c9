"""Workers on PostgreSQL: throughput, submit-to-start latency, and recovery after kill -9.

- throughput: N no-op executions inserted up front, then 1 (and 2) ``veracity worker``
  processes; the rate is N over the time from the first claim to the last completion, both
  read from the database's own timestamps. Then the same for 1 worker with a backlog of
  100,000 pending executions of another deployment due before its own (stranded ones,
  say): a worker claims only its own deployment's (docs/deployments.md), without reading
  those.
- latency: one idle worker; no-op executions submitted one at a time; submit-to-start is
  the ``running`` event's time minus ``created_at``, submit-to-end the ``completed``
  event's (both the database clock), with the worker's hand-offs (docs/workers.md) and
  without (``worker.handoff = false``). A handed-off execution's ``running`` event is
  written with its submission (submit-to-start 0): its submit-to-end is what compares.
- recovery: executions in the middle of slow steps, the worker killed with SIGKILL, a second
  worker and a recovery loop running; the time from the kill to all finished, against
  TTL + recovery interval + 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from bench._util import scratch_pg_database, veracity_bin
from veracity._ids import new_execution_id, new_execution_ids
from veracity.core.states import Status
from veracity.maintenance.recovery import RecoveryService
from veracity.models import ExecutionFilter, NewExecution
from veracity.store import open_store

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def worker_procs(url: str, n: int, **env: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    # the deployment the executions are inserted with: a worker claims only its own
    full = dict(os.environ, VERACITY_DATABASE_URL=url, VERACITY_APP="bench.apps:app",
                PYTHONPATH=str(ROOT), VERACITY_LOG_LEVEL="warning",
                VERACITY_DEPLOYMENT_ID="bench", **env)
    procs = [subprocess.Popen([veracity_bin(), "worker"], env=full,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


async def migrate(url: str) -> None:
    store = await open_store(url)
    await store.migrate()
    await store.close()


def insert_noops(url: str, n: int, ffqn: str = "bench:noop/run.fn",
                 deployment_id: str = "bench", ago: float = 0.0) -> None:
    """Bulk-insert n pending executions of ``ffqn`` (and their creation events) in one
    statement, due ``ago`` seconds ago. Their ids are made as Veracity makes them
    (time-ordered, veracity/_ids.py): random ones would land all over the primary keys of
    a large table, a cost Veracity's own submissions do not have (bench/journal.md,
    Growth)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            WITH ins AS (
                INSERT INTO veracity_executions (id, ffqn, params, status, deployment_id,
                    scheduled_at, created_at, updated_at, history_seq)
                SELECT id, %s, '[]', 'pending', %s,
                       now() - make_interval(secs => %s), now(), now(), 1
                FROM unnest(%s::uuid[]) AS i (id)
                RETURNING id, created_at
            )
            INSERT INTO veracity_history (execution_id, seq, kind, at, data)
            SELECT id, 1, 'pending', created_at, '{}' FROM ins
            """,
            [ffqn, deployment_id, ago, new_execution_ids(n)],
        )


def wait_done(url: str, n: int, timeout: float) -> None:
    """Until n executions are completed."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM veracity_executions WHERE status = 'completed'"
            ).fetchone()
            if row and row[0] >= n:
                return
            time.sleep(0.2)
    raise SystemExit(f"not all {n} executions completed within {timeout}s")


def throughput(workers: int, n: int, concurrency: int, backlog: int = 0) -> float:
    with scratch_pg_database() as url:
        asyncio.run(migrate(url))
        if backlog:  # another deployment's, due an hour before ours
            insert_noops(url, backlog, deployment_id="bench-old", ago=3600)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("ANALYZE veracity_executions")
        insert_noops(url, n)
        with worker_procs(url, workers, VERACITY_WORKER_CONCURRENCY=str(concurrency)):
            wait_done(url, n, timeout=300)
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM max(updated_at) - "
                "(SELECT min(at) FROM veracity_history WHERE kind = 'running')) "
                "FROM veracity_executions WHERE deployment_id = 'bench'"
            ).fetchone()
            assert row is not None
            completed = conn.execute(
                "SELECT count(*) FROM veracity_history WHERE kind = 'completed'"
            ).fetchone()
            assert completed == (n,), completed
            left = conn.execute("SELECT count(*) FROM veracity_executions "
                                "WHERE deployment_id = 'bench-old' AND status = 'pending'"
                                ).fetchone()
            assert left == (backlog,), left  # the other deployment's were left alone
            return n / float(row[0])


async def _latency(url: str, samples: int) -> tuple[list[float], list[float]]:
    store = await open_store(url)
    try:
        ids = []
        for _ in range(samples):
            sub = await store.execution_submit(NewExecution(
                ffqn="bench:noop/run.fn", params=[], deployment_id="bench",
                id=new_execution_id()))
            ids.append(sub.execution.id)
            await asyncio.sleep(0.01)  # one at a time, to an idle worker
        await asyncio.sleep(1.0)
    finally:
        await store.close()
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM h.at - e.created_at), "
            "extract(epoch FROM d.at - e.created_at) FROM veracity_executions e "
            "JOIN veracity_history h ON h.execution_id = e.id AND h.kind = 'running' "
            "JOIN veracity_history d ON d.execution_id = e.id AND d.kind = 'completed' "
            "WHERE e.id = ANY(%s)", [ids]
        ).fetchall()
    return ([float(r[0]) * 1000 for r in rows], [float(r[1]) * 1000 for r in rows])


def latency(samples: int, handoff: bool = True
            ) -> tuple[tuple[float, float, float], tuple[float, float, float], int]:
    """(p50, p95, p99) of submit-to-start and of submit-to-end, and the sample count."""
    with scratch_pg_database() as url:
        asyncio.run(migrate(url))
        with worker_procs(url, 1, VERACITY_WORKER_HANDOFF=str(handoff).lower()):
            time.sleep(1.5)  # let it start and go idle
            start, end = asyncio.run(_latency(url, samples))

    def qs(values: list[float]) -> tuple[float, float, float]:
        q = statistics.quantiles(sorted(values), n=100, method="inclusive")
        return q[49], q[94], q[98]
    return qs(start), qs(end), len(start)


async def _recovery(url: str, ttl: float, interval: float, n: int) -> tuple[float, float]:
    """(kill to every execution recovered from the dead worker, kill to all finished).
    Each workflow has 10 steps of 50 ms; the kill lands about halfway, so about 0.25 s of
    work is left to redo after recovery."""
    logging.getLogger("veracity").setLevel(logging.ERROR)
    store = await open_store(url)
    try:
        for _ in range(n):
            await store.execution_submit(NewExecution(
                ffqn="bench:slow/run.fn", params=[10, 0.05], deployment_id="bench",
                id=new_execution_id()))
        env = {"VERACITY_LEASE_TTL": str(ttl), "VERACITY_WORKER_CONCURRENCY": str(n)}
        with worker_procs(url, 1, **env) as (victim,):
            while len(await store.execution_list(
                    ExecutionFilter(statuses=(Status.RUNNING,)), limit=n)) < n:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.25)  # everything claimed and mid-steps
            victim.send_signal(signal.SIGKILL)
            killed = time.monotonic()
        recovered_after: float | None = None
        with worker_procs(url, 1, **env):
            recovery = RecoveryService(store, max_attempts=5)
            while True:
                result = await recovery.run_once()
                now = time.monotonic()
                if recovered_after is None and result.retried:
                    stuck = [e for e in await store.execution_list(
                        ExecutionFilter(statuses=(Status.RUNNING,)), limit=n)
                        if e.attempt == 1]
                    if not stuck:
                        recovered_after = now - killed
                done = await store.execution_list(
                    ExecutionFilter(statuses=(Status.COMPLETED,)), limit=n)
                if len(done) == n:
                    return recovered_after or now - killed, now - killed
                await asyncio.sleep(min(interval, 0.05) if recovered_after else interval)
    finally:
        await store.close()


def recovery(ttl: float, interval: float, n: int) -> tuple[float, float]:
    with scratch_pg_database() as url:
        asyncio.run(migrate(url))
        return asyncio.run(_recovery(url, ttl, interval, n))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--executions", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--backlog", type=int, default=100_000,
                        help="pending executions of another deployment, due first")
    args = parser.parse_args(argv)
    for n_workers in (1, 2):
        rate = throughput(n_workers, args.executions, args.concurrency)
        print(f"workers  postgresql  {n_workers} worker process(es), concurrency "
              f"{args.concurrency}: {rate:,.0f} no-op executions/s ({args.executions})")
    rate = throughput(1, args.executions, args.concurrency, backlog=args.backlog)
    print(f"workers  postgresql  1 worker process, concurrency {args.concurrency}, "
          f"{args.backlog:,} pending executions of another deployment due first: "
          f"{rate:,.0f} no-op executions/s ({args.executions})")
    for handoff in (True, False):
        start, end, count = latency(args.samples, handoff)
        print(f"workers  postgresql  idle worker, hand-offs {'on' if handoff else 'off'} "
              f"({count} samples): submit-to-start p50 {start[0]:.2f} ms, p95 "
              f"{start[1]:.2f} ms, p99 {start[2]:.2f} ms; submit-to-end p50 {end[0]:.2f} ms, "
              f"p95 {end[1]:.2f} ms, p99 {end[2]:.2f} ms")
    ttl, interval = 3.0, 1.0
    recovered, finished = recovery(ttl, interval, 50)
    print(f"workers  postgresql  kill -9 of a worker running 50 executions: all recovered "
          f"after {recovered:.2f} s, all finished after {finished:.2f} s (target: TTL {ttl:g} s "
          f"+ recovery interval {interval:g} s + 1 s = {ttl + interval + 1:g} s)")



if __name__ == "__main__":
    main()
