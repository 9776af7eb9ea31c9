"""Cost that does not grow with history, on PostgreSQL (docs/operations.md, Retention).

Two scratch databases: one stays empty, the other is filled with terminal executions up to
each size in ``--sizes`` (default: 1,000,000) and measured at each. Filling inserts top-level
executions straight into the tables (99 % ``completed``, 1 % ``failed``, 0.1 %
``cancelled``, 0.01 % ``failed_transient`` and flagged ``forced``; four FFQNs, and one
row in 100,000 of a fifth, ``rare:``; three deployments; three history events each),
ended over the last 40 days, then VACUUM ANALYZE. At each size:

- claims: one ``veracity worker`` process at the default settings (``worker.concurrency``
  256) is started and left to become idle; then, right after a ``CHECKPOINT``
  (``_checkpoint``), ``--executions`` no-op executions (default 5,000) are inserted pending
  in one statement, and the worker drains them. The rate is N over the time from the first
  claim to the last completion, both the database's clock (as bench/workers.py). The cost
  is the CPU time over N, from just before the insert to the last completion, of the
  database's backends serving the worker (``/proc/PID/schedstat``; its connections, known
  by their ``application_name``, ``PGAPPNAME`` in its environment; PostgreSQL's shared
  background processes left out, as in bench/scaling.py) and of the worker process
  (``/proc/PID/stat``; its start-up left out). A rate moves with the machine's speed from
  minute to minute; the database's CPU an execution is what says whether a claim costs
  more on a larger table. Median of ``--runs`` runs (default 4: a drain of 5,000 lasts
  half a second on a fast machine, and two were not enough; bench/journal.md, Growth), each
  beside a run on the empty database, alternating (``interleaved_claims``), so that the
  ratios compare runs of the same minutes.
- list pages: each filter ``GET /v1/executions`` offers, and a few combinations (a status
  with a prefix none of its rows has among them), its first page of 50 through the
  store (``execution_list``, in process: the query, not HTTP); the median of 20 calls
  after 3 warm-ups.

Then, on the largest size, the prune rate: ``veracity prune``'s pass (RetentionService)
deleting what ended more than 30 days ago (about a quarter), in executions (with their
history) deleted per second of wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg

from bench._util import backend_cpu_seconds, process_cpu, scratch_pg_database
from bench.workers import insert_noops, migrate, worker_procs
from veracity.core.states import Status
from veracity.maintenance.retention import RetentionService
from veracity.models import ExecutionFilter, ListCursor
from veracity.store import open_store

FILL = """
WITH ins AS (
    INSERT INTO veracity_executions (
        id, ffqn, params, status, result, error, deployment_id, scheduled_at, created_at,
        updated_at, started_at, history_seq, flagged_at, flag_kind, flag_reason)
    -- time-ordered ids as Veracity makes them (veracity/_ids.py): the creation time's
    -- milliseconds, the version 7 and variant bits, random bits
    SELECT (lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') || '7'
            || substr(md5(random()::text), 1, 3) || '8'
            || substr(md5(random()::text), 1, 15))::uuid,
           CASE WHEN i %% 100000 = 7 THEN 'rare:x/y.run'
                ELSE (ARRAY['shop:orders/process.run', 'shop:mail/send.run',
                            'billing:invoices/make.run', 'ops:cleanup/run.run'])[1 + i %% 4]
           END,
           '[]',
           CASE WHEN i %% 100 = 0 THEN 'failed' WHEN i %% 1000 = 1 THEN 'cancelled'
                WHEN i %% 10000 = 3 THEN 'failed_transient' ELSE 'completed' END,
           CASE WHEN i %% 100 = 0 OR i %% 1000 = 1 OR i %% 10000 = 3 THEN NULL
                ELSE '{"ok": true}'::json END,
           CASE WHEN i %% 100 = 0 OR i %% 10000 = 3 THEN '{"code": "boom"}'::json END,
           'dep-' || (i %% 3), t, t, t, t, 3,
           -- ended by an operator without the engine's confirmation: flagged, forced
           CASE WHEN i %% 10000 = 3 THEN t END,
           CASE WHEN i %% 10000 = 3 THEN 'forced' END,
           CASE WHEN i %% 10000 = 3 THEN 'bench' END
    FROM generate_series(%(first)s::int, %(last)s::int) AS i,
         LATERAL (SELECT now() - interval '40 days'
                         + (i / %(total)s::float8) * interval '40 days' AS t) AS at
    RETURNING id, status, created_at
)
INSERT INTO veracity_history (execution_id, seq, kind, at, data)
SELECT id, s.seq, CASE s.seq WHEN 1 THEN 'pending' WHEN 2 THEN 'running' ELSE status END,
       created_at, '{}'
FROM ins, (VALUES (1), (2), (3)) AS s (seq)
"""

FILTERS: list[tuple[str, ExecutionFilter]] = [
    ("unfiltered", ExecutionFilter()),
    ("status=failed", ExecutionFilter(statuses=(Status.FAILED,))),
    ("status=cancelled", ExecutionFilter(statuses=(Status.CANCELLED,))),
    ("status=pending,running", ExecutionFilter(statuses=(Status.PENDING, Status.RUNNING))),
    ("ffqn_prefix=shop:mail", ExecutionFilter(ffqn_prefix="shop:mail")),
    ("ffqn_prefix=rare:", ExecutionFilter(ffqn_prefix="rare:")),
    ("deployment_id=dep-1", ExecutionFilter(deployment_id="dep-1")),
    ("status=completed", ExecutionFilter(statuses=(Status.COMPLETED,))),
    ("flagged", ExecutionFilter(flagged=True)),
    ("flagged=false", ExecutionFilter(flagged=False)),
    ("created_after", ExecutionFilter(created_after=datetime(2000, 1, 1, tzinfo=UTC))),
    ("created_before", ExecutionFilter(created_before=datetime(2000, 1, 1, tzinfo=UTC))),
    # combined: a status and a prefix none of its rows has (no failed row is a mail's),
    # and some that match
    ("status=failed&ffqn_prefix=shop:mail",
     ExecutionFilter(statuses=(Status.FAILED,), ffqn_prefix="shop:mail")),
    ("status=failed&ffqn_prefix=shop:orders",
     ExecutionFilter(statuses=(Status.FAILED,), ffqn_prefix="shop:orders")),
    ("status=completed&deployment_id=dep-1",
     ExecutionFilter(statuses=(Status.COMPLETED,), deployment_id="dep-1")),
    ("ffqn_prefix=shop:mail&flagged", ExecutionFilter(ffqn_prefix="shop:mail", flagged=True)),
    ("deployment_id=dep-1&flagged", ExecutionFilter(deployment_id="dep-1", flagged=True)),
    # since migration 0020: a status in a deployment, a status of several workflows, a
    # rare workflow in a common deployment, a common status with flagged
    ("status=failed&deployment_id=dep-1",
     ExecutionFilter(statuses=(Status.FAILED,), deployment_id="dep-1")),
    ("status=cancelled&ffqn_prefix=shop:",
     ExecutionFilter(statuses=(Status.CANCELLED,), ffqn_prefix="shop:")),
    ("ffqn_prefix=rare:&deployment_id=dep-1",
     ExecutionFilter(ffqn_prefix="rare:", deployment_id="dep-1")),
    ("status=completed&flagged", ExecutionFilter(statuses=(Status.COMPLETED,), flagged=True)),
]
"""Each filter ``GET /v1/executions`` offers, alone, then a few combined; and
(``list_pages``) a page far down the unfiltered list, after a cursor in the middle of the
table."""


def fill(url: str, have: int, want: int, chunk: int = 200_000) -> float:
    """Top-level terminal executions up to ``want`` in all; seconds it took."""
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        first = have + 1
        while first <= want:
            last = min(first + chunk - 1, want)
            conn.execute(FILL, {"first": first, "last": last, "total": want})
            first = last + 1
        conn.execute("VACUUM ANALYZE veracity_executions")
        conn.execute("VACUUM ANALYZE veracity_history")
    return time.monotonic() - started


@dataclass(frozen=True)
class Drain:
    """One drain of ``claims``: executions/s, and the database's and the worker's CPU
    seconds an execution."""
    rate: float
    db_cpu: float
    worker_cpu: float


WORKER_APP = "bench-growth-worker"
"""The ``application_name`` of the measured worker's connections (``PGAPPNAME``)."""


def claims(url: str, n: int) -> Drain:
    """One idle worker at the defaults drains n new no-op executions (see the module's
    doc)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM veracity_history WHERE execution_id IN "
                     "(SELECT id FROM veracity_executions WHERE deployment_id = 'bench')")
        conn.execute("DELETE FROM veracity_executions WHERE deployment_id = 'bench'")
    with worker_procs(url, 1, PGAPPNAME=WORKER_APP) as (worker,), \
            psycopg.connect(url, autocommit=True) as conn:
        _wait_registered(conn, worker.pid)
        time.sleep(0.5)  # its first claim found nothing: idle, listening
        _checkpoint(url)
        before = {pid: backend_cpu_seconds(pid) for pid in _worker_backends(conn)}
        last = dict(before)
        worker_before = process_cpu(worker.pid)
        insert_noops(url, n)
        deadline = time.monotonic() + 600
        while _unfinished(conn):
            if time.monotonic() > deadline:
                raise SystemExit(f"not all {n} executions completed")
            for pid in _worker_backends(conn):
                before.setdefault(pid, 0.0)  # opened meanwhile: all of its CPU
                last[pid] = backend_cpu_seconds(pid) or last.get(pid, 0.0)
            time.sleep(0.05)
        for pid in before:
            last[pid] = backend_cpu_seconds(pid) or last.get(pid, 0.0)
        worker_cpu = process_cpu(worker.pid) - worker_before
        row = conn.execute("SELECT count(*) FROM veracity_executions WHERE "
                           "deployment_id = 'bench' AND status = 'completed'").fetchone()
        if row is None or row[0] != n:
            raise SystemExit(f"{row and row[0]} of {n} executions completed")
        row = conn.execute(
            "SELECT extract(epoch FROM max(e.updated_at) - min(h.at)) "
            "FROM veracity_executions AS e JOIN veracity_history AS h "
            "ON h.execution_id = e.id AND h.kind = 'running' "
            "WHERE e.deployment_id = 'bench'").fetchone()
    assert row is not None
    db_cpu = sum(last[pid] - cpu for pid, cpu in before.items())
    return Drain(n / float(row[0]), db_cpu / n, worker_cpu / n)


def _wait_registered(conn: psycopg.Connection[tuple[int]], pid: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = conn.execute("SELECT count(*) FROM veracity_workers WHERE pid = %s AND "
                           "stopped_at IS NULL", [pid]).fetchone()
        if row and row[0]:
            return
        time.sleep(0.05)
    raise SystemExit("the worker did not register within 30 s")


def _worker_backends(conn: psycopg.Connection[tuple[int]]) -> list[int]:
    rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND application_name = %s", [WORKER_APP]).fetchall()
    return [int(r[0]) for r in rows]


def _checkpoint(url: str) -> None:
    """Start each run right after a checkpoint, on the empty table as on the filled one.
    Filling writes gigabytes of WAL, and with the default ``max_wal_size`` (1 GB) the
    server then checkpoints back to back for a while (its log: "checkpoints are occurring
    too frequently"): a run measured in that wake pays for the fill's checkpoints (their
    writes, a full-page image in the WAL for every page it touches first after each one)
    and measures the loading, not the table's size (bench/journal.md, Growth)."""
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            print("growth   (CHECKPOINT needs a superuser or pg_checkpoint: runs start "
                  "wherever the server's checkpoints are)")


def _unfinished(conn: psycopg.Connection[tuple[int]]) -> int:
    # through veracity_executions_unfinished: the poll reads the bench's own rows, not the
    # table (a count of completed rows scanned all of it, some 120 ms a call at 1M, five
    # times a second, on the cores the worker measured beside it needs)
    row = conn.execute("SELECT count(*) FROM veracity_executions WHERE "
                       "deployment_id = 'bench' AND status IN "
                       "('pending', 'running', 'blocked', 'paused')").fetchone()
    assert row is not None
    return int(row[0])


async def list_pages(url: str) -> dict[str, float]:
    store = await open_store(url, pool_size=1)
    out: dict[str, float] = {}
    try:
        # the cursor of a page in the middle of the table (the newest row created before
        # the middle of the span the fill covered): a page far down the list
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT created_at, id FROM veracity_executions WHERE created_at < "
                "(SELECT min(created_at) + (max(created_at) - min(created_at)) / 2 "
                " FROM veracity_executions) ORDER BY created_at DESC, id DESC LIMIT 1"
            ).fetchone()
        deep = [("cursor (mid-table)", ExecutionFilter(), ListCursor(row[0], row[1]))
                ] if row is not None else []
        for name, f, after in [(n, f, None) for n, f in FILTERS] + deep:
            times = []
            for i in range(23):
                t = time.perf_counter()
                await store.execution_list(f, limit=50, after=after)
                if i >= 3:
                    times.append((time.perf_counter() - t) * 1000)
            out[name] = statistics.median(times)
    finally:
        await store.close()
    return out


async def prune_rate(url: str, older_than_days: float) -> tuple[int, int, float]:
    store = await open_store(url, pool_size=2)
    try:
        service = RetentionService(store, older_than=older_than_days * 86400)
        started = time.monotonic()
        result = await service.run_once()
        took = time.monotonic() - started
    finally:
        await store.close()
    return result.executions, result.history, took


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000000",
                        help="comma-separated table sizes (terminal executions) to measure "
                             "at, after the empty table")
    parser.add_argument("--executions", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    # two scratch databases: ``empty`` stays empty, ``url`` is filled; at each size the
    # claims alternate between them, so both rates are measured in the same minutes
    with scratch_pg_database() as empty, scratch_pg_database() as url:
        asyncio.run(migrate(empty))
        asyncio.run(migrate(url))
        pages = asyncio.run(list_pages(empty))
        print("growth   postgresql  0 terminal executions: first list page (50), median "
              "ms: " + ", ".join(f"{k} {v:.2f}" for k, v in pages.items()))
        have = 0
        for size in sizes:
            if size > have:
                took = fill(url, have, size)
                print(f"growth   postgresql  filled to {size:,} terminal executions "
                      f"({3 * size:,} history rows) in {took:.0f} s")
                have = size
            filled, base = interleaved_claims(empty, url, args.executions, args.runs)
            print(f"growth   postgresql  {size:,} terminal executions: 1 worker (defaults) "
                  f"drains {args.executions:,} no-ops: {describe(filled)}; the empty table, "
                  f"runs interleaved: {describe(base)}; filled against empty: rate "
                  f"{_median(filled, 'rate') / _median(base, 'rate'):.0%}, the database's "
                  f"CPU an execution {_median(filled, 'db_cpu') / _median(base, 'db_cpu'):.0%}")
            pages = asyncio.run(list_pages(url))
            print(f"growth   postgresql  {size:,} terminal executions: first list page "
                  "(50), median ms: " + ", ".join(f"{k} {v:.2f}" for k, v in pages.items()))
        if have:
            deleted, history, took = asyncio.run(prune_rate(url, 30))
            print(f"growth   postgresql  prune of {have:,}: {deleted:,} executions and "
                  f"{history:,} history rows that ended over 30 days ago deleted in "
                  f"{took:.1f} s: {deleted / took:,.0f} executions/s")


def interleaved_claims(empty: str, filled: str, n: int,
                       runs: int) -> tuple[list[Drain], list[Drain]]:
    """``runs`` drains on each database, alternating, the first of each pair switching
    sides every run: (the filled table's drains, the empty table's)."""
    on_filled: list[Drain] = []
    on_empty: list[Drain] = []
    for run in range(runs):
        order = [(filled, on_filled), (empty, on_empty)]
        for database, drains in order if run % 2 == 0 else reversed(order):
            drains.append(claims(database, n))
    return on_filled, on_empty


def _median(drains: list[Drain], what: str) -> float:
    return float(statistics.median(getattr(d, what) for d in drains))


def describe(drains: list[Drain]) -> str:
    """The medians of a size's drains, then each run's figures."""
    return (f"{_median(drains, 'rate'):,.0f}/s, the database's CPU "
            f"{_median(drains, 'db_cpu') * 1e6:.1f} µs and the worker's "
            f"{_median(drains, 'worker_cpu') * 1e6:.1f} µs an execution (runs: "
            + ", ".join(f"{d.rate:,.0f}/s {d.db_cpu * 1e6:.1f}/{d.worker_cpu * 1e6:.1f} µs"
                        for d in drains) + ")")


if __name__ == "__main__":
    main()
