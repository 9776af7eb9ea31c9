"""Single submissions through :class:`veracity.AsyncDatabaseClient`, on PostgreSQL: what
one call costs the submitting process, beside a plain ``INSERT`` on the same database.

- one caller: ``--submissions`` calls of ``submit``, one after another, each durable when
  it returns; submissions/s, and the submitting process's CPU per submission
  (``time.process_time``);
- ``--callers`` at once: tasks of one process sharing one client, each one call at a time
  (submissions that arrive together share a transaction, docs/scaling.md);
- the floor: the same number of one-row ``INSERT``s into a table of three columns, one
  psycopg connection (autocommit), one after another: what one durable statement costs
  from Python here with nothing of Veracity's.

Each is run ``--rounds`` times, alternating, on one scratch database; the figures are
listed per round with their median. The CPU figures are the process's own, so the
database's share of the two cores does not enter them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import psycopg

from bench._util import scratch_pg_database
from veracity import AsyncDatabaseClient
from veracity.store import open_store

APP = "bench.peers.vapp:app"
FFQN = "bench:peers/job.fn"


async def _one_caller(client: AsyncDatabaseClient, n: int, tag: str) -> tuple[float, float]:
    submit = client.submit
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        await submit(FFQN, "noop", f"{tag}-{i}")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return n / wall, cpu / n


async def _callers(client: AsyncDatabaseClient, n: int, callers: int, tag: str
                   ) -> tuple[float, float]:
    submit = client.submit

    async def caller(c: int) -> None:
        for i in range(n // callers):
            await submit(FFQN, "noop", f"{tag}-{c}-{i}")

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done = n // callers * callers
    return done / wall, cpu / done


async def _plain(conn: psycopg.AsyncConnection[tuple[object, ...]], n: int, tag: str
                 ) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        await conn.execute("INSERT INTO bench_plain (kind, key) VALUES (%s, %s)",
                           ["noop", f"{tag}-{i}"])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return n / wall, cpu / n


async def run(url: str, n: int, callers: int, rounds: int
              ) -> dict[str, list[tuple[float, float]]]:
    store = await open_store(url)
    await store.migrate()
    await store.close()
    out: dict[str, list[tuple[float, float]]] = {"one": [], "many": [], "plain": []}
    os.environ["VERACITY_DEPLOYMENT_ID"] = "bench"  # the workers' of bench.peers
    try:
        async with AsyncDatabaseClient(url, app=APP) as client, \
                await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("CREATE TABLE bench_plain (id bigserial PRIMARY KEY, "
                               "kind text NOT NULL, key text NOT NULL)")
            await _one_caller(client, 200, "warm")  # prepared statements, pool
            await _plain(conn, 200, "warm")
            for r in range(rounds):
                out["one"].append(await _one_caller(client, n, f"one{r}"))
                out["many"].append(await _callers(client, n, callers, f"many{r}"))
                out["plain"].append(await _plain(conn, n, f"plain{r}"))
    finally:
        del os.environ["VERACITY_DEPLOYMENT_ID"]
    return out


def _line(name: str, got: list[tuple[float, float]]) -> str:
    rates = ", ".join(f"{r:,.0f}" for r, _ in got)
    cpus = ", ".join(f"{c * 1e6:.0f}" for _, c in got)
    return (f"{name}: {statistics.median(r for r, _ in got):,.0f}/s ({rates}); the "
            f"submitting process's CPU {statistics.median(c for _, c in got) * 1e6:.0f} µs "
            f"a submission ({cpus})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--submissions", type=int, default=2000)
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.submissions < 1 or args.rounds < 1:
        parser.error("--submissions and --rounds must be at least 1")
    if not 1 <= args.callers <= args.submissions:
        parser.error("--callers must be between 1 and --submissions")
    with scratch_pg_database() as url:
        got = asyncio.run(run(url, args.submissions, args.callers, args.rounds))
    print(f"single submissions on PostgreSQL, {args.submissions} per round, median of "
          f"{args.rounds} (load average {os.getloadavg()[0]:.1f}):")
    print("  " + _line("AsyncDatabaseClient, one caller", got["one"]))
    print("  " + _line(f"AsyncDatabaseClient, {args.callers} callers at once", got["many"]))
    print("  " + _line("plain INSERT, psycopg, one caller", got["plain"]))


if __name__ == "__main__":
    main()
