"""How Veracity's workers scale on one PostgreSQL (docs/scaling.md).

For 1, 2 and 4 ``veracity worker`` processes at their defaults (``worker.concurrency``
256), each run alone in a scratch database: ``--executions`` no-op executions inserted, the workers
started; then

- executions/s: N over the first claim to the last completion, both the database's clock
  (as ``bench.workers``);
- database CPU per execution: the CPU time (``/proc/PID/schedstat``, else ``stat``) of the
  PostgreSQL backends serving that database, read just before the executions are inserted
  and after the last one completed, over N; PostgreSQL's shared background processes (WAL
  writer, checkpointer) are left out, so it is a lower bound. Needs the benchmark to run on
  the database's machine;
- worker CPU per execution: the worker processes' CPU over the same span, over N;
- connections: the database's backends (``pg_stat_activity``), idle before the insert and
  the most seen while draining (polled every 20 ms).

Also a ``veracity server`` (PostgreSQL: no in-process worker), idle: its connections.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import psycopg

from bench._util import PG_URL, backend_cpu_seconds, scratch_pg_database, server
from bench.workers import insert_noops, migrate, worker_procs
from veracity.config import WorkerSettings

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def backend_pids(name: str) -> list[int]:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s",
                            [name]).fetchall()
    return [int(r[0]) for r in rows]


def run(workers: int, n: int) -> str:
    with scratch_pg_database() as url:
        name = url.rsplit("/", 1)[1]
        asyncio.run(migrate(url))
        with worker_procs(url, workers) as procs, \
                psycopg.connect(url, autocommit=True) as conn:
            time.sleep(3.0)  # started, registered, idle
            mine = conn.execute("SELECT pg_backend_pid()").fetchone()
            own = int(mine[0]) if mine else 0
            pids = [p for p in backend_pids(name) if p != own]
            idle = len(pids)
            db_before = {p: backend_cpu_seconds(p) for p in pids}
            w_before = sum(cpu_seconds(p.pid) for p in procs)
            insert_noops(url, n)
            busiest = idle
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                now = [p for p in backend_pids(name) if p != own]
                busiest = max(busiest, len(now))
                for p in now:
                    db_before.setdefault(p, 0.0)  # a backend opened meanwhile: all its CPU
                row = conn.execute("SELECT count(*) FROM veracity_executions "
                                   "WHERE status <> 'completed'").fetchone()
                if row and row[0] == 0:
                    break
                time.sleep(0.02)
            else:
                raise SystemExit(f"{workers} worker(s): not all {n} executions completed")
            db_cpu = sum(backend_cpu_seconds(p) - before for p, before in db_before.items())
            w_cpu = sum(cpu_seconds(p.pid) for p in procs) - w_before
            row = conn.execute(
                "SELECT extract(epoch FROM max(updated_at) - "
                "(SELECT min(at) FROM veracity_history WHERE kind = 'running')) "
                "FROM veracity_executions").fetchone()
            assert row is not None
            rate = n / float(row[0])
        return (f"scaling  {workers} worker process(es), default concurrency "
                f"{WorkerSettings().concurrency}: {rate:,.0f} "
                f"executions/s; database CPU {db_cpu / n * 1000:.3f} ms and workers' CPU "
                f"{w_cpu / n * 1000:.3f} ms per execution; connections idle {idle}, at most "
                f"{busiest} ({n} no-op executions)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--executions", type=int, default=5000)
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4])
    args = parser.parse_args(argv)
    for w in args.workers:
        print(run(w, args.executions), flush=True)
    with scratch_pg_database() as url:
        name = url.rsplit("/", 1)[1]
        asyncio.run(migrate(url))
        with server(url):
            time.sleep(2.0)
            print(f"scaling  veracity server (PostgreSQL, no in-process worker): "
                  f"connections idle {len(backend_pids(name))}")


if __name__ == "__main__":
    main()
