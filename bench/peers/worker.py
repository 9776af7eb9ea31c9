"""One worker process of a peer (or of the plain SKIP LOCKED queue):
``python -m bench.peers.worker SYSTEM JOB URL [--recovery] [--dbos-polling S]``.

Each runs its system's documented worker with its defaults, except with ``--recovery``:
then its lease, heartbeat or stalled-job threshold is 5 s (``LEASE_SECONDS``) and it runs
16 jobs at once, as the kill -9 workload needs. Runs until killed or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import threading
from datetime import timedelta
from typing import Any

import psycopg

from bench.peers import jobs
from bench.peers.systems import LEASE_SECONDS, procrastinate_app

RECOVERY_CONCURRENCY = 16
RECOVERY_POLL = 1.0
"""Seconds between the checks that find a dead worker's jobs, for every system in the
kill -9 workload (Veracity's ``recovery.interval``, PGQueuer's ``dequeue_timeout``,
Procrastinate's ``fetch_job_polling_interval`` and stalled-job check)."""


async def plain(url: str, recovery: bool) -> None:
    """The ceiling: claim one row with FOR UPDATE SKIP LOCKED and a lease, run it, delete it;
    idle claimers wait for the insert trigger's NOTIFY (or 1 s)."""
    wake = asyncio.Event()
    listener = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await listener.execute("LISTEN plain_jobs")

    async def listen() -> None:
        async for _ in listener.notifies():
            wake.set()

    async def claimer() -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            while True:
                cur = await conn.execute(
                    "UPDATE plain_jobs SET locked_until = now() + make_interval(secs => %s) "
                    "WHERE id = (SELECT id FROM plain_jobs WHERE locked_until IS NULL "
                    "OR locked_until < now() ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1) "
                    "RETURNING id, kind, key", [LEASE_SECONDS])
                row = await cur.fetchone()
                if row is None:
                    wake.clear()
                    try:
                        await asyncio.wait_for(wake.wait(), 1.0)
                    except TimeoutError:
                        pass
                    continue
                await jobs.run(row[1], row[2])
                await conn.execute("DELETE FROM plain_jobs WHERE id = %s", [row[0]])

    n = RECOVERY_CONCURRENCY if recovery else 4
    await asyncio.gather(listen(), *(claimer() for _ in range(n)))


async def pgqueuer(url: str, recovery: bool) -> None:
    # asyncpg, as PGQueuer's quick start and tuning guide use it (its psycopg driver holds
    # the connection while it waits up to 1 s for a notification, and the worker's own
    # statements wait behind it)
    import asyncpg
    from pgqueuer import AsyncpgDriver, PgQueuer

    conn = await asyncpg.connect(url)
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("job")
    async def job(j: Any) -> None:
        payload = json.loads(j.payload)
        await jobs.run(payload["kind"], payload["key"])

    if recovery:
        # its polling fallback every second, as Veracity's recovery and Procrastinate's
        # stalled-job check run here: a dead worker's picked jobs are found by polling
        await pgq.run(heartbeat_timeout=timedelta(seconds=LEASE_SECONDS),
                      batch_size=RECOVERY_CONCURRENCY,
                      dequeue_timeout=timedelta(seconds=RECOVERY_POLL))
    else:
        await pgq.run()


async def procrastinate(url: str, recovery: bool) -> None:
    app = procrastinate_app(url)
    async with app.open_async():
        if not recovery:
            # async jobs: many at once, as its docs advise with `concurrency` (one by default)
            await app.run_worker_async(concurrency=RECOVERY_CONCURRENCY)
            return

        async def retry_stalled() -> None:
            # the documented way to retry the jobs of a dead worker: stalled jobs by
            # heartbeat age, retried (here every second, with a 5 s threshold)
            while True:
                for stalled in await app.job_manager.get_stalled_jobs(
                        seconds_since_heartbeat=LEASE_SECONDS):
                    await app.job_manager.retry_job(stalled)
                await asyncio.sleep(1.0)

        await asyncio.gather(
            # a retried job is an UPDATE, which its notify trigger does not announce: the
            # worker finds it at its poll, every second here as the recovery check runs
            app.run_worker_async(concurrency=RECOVERY_CONCURRENCY,
                                 update_heartbeat_interval=1.0,
                                 stalled_worker_timeout=LEASE_SECONDS,
                                 fetch_job_polling_interval=RECOVERY_POLL),
            retry_stalled())


def dbos(url: str, polling: float) -> None:
    """Registered and launched outside any event loop, as DBOS asks; its queue runs the
    async workflows on its own loop."""
    from dbos import DBOS

    DBOS(config={"name": "bench-peers", "system_database_url": url})

    @DBOS.workflow(name="job")
    async def job(kind: str, key: str) -> None:
        await jobs.run(kind, key)

    @DBOS.step()
    async def value(i: int) -> int:
        return i

    @DBOS.workflow(name="three_steps")
    async def three_steps(key: str) -> int:
        total = 0
        for i in range(3):
            total += await value(i)
        return total

    DBOS.launch()
    DBOS.register_queue("bench", polling_interval_sec=polling)  # after launch, as it must be
    threading.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("system", choices=["plain", "pgqueuer", "procrastinate", "dbos"])
    parser.add_argument("job")
    parser.add_argument("url")
    parser.add_argument("--recovery", action="store_true")
    parser.add_argument("--dbos-polling", type=float, default=1.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
    if args.system == "plain":
        asyncio.run(plain(args.url, args.recovery))
    elif args.system == "pgqueuer":
        asyncio.run(pgqueuer(args.url, args.recovery))
    elif args.system == "procrastinate":
        asyncio.run(procrastinate(args.url, args.recovery))
    else:
        dbos(args.url, args.dbos_polling)


if __name__ == "__main__":
    main()
