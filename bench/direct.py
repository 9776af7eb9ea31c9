"""Single submissions through :class:`veracity.AsyncDatabaseClient`, on PostgreSQL: what
one call costs the submitting process, beside a plain ``INSERT`` on the same database.

- one caller: ``--submissions`` calls of ``submit``, one after another, each durable when
  it returns; submissions/s, and the submitting process's CPU per submission
  (``time.process_time``);
- ``--callers`` at once: tasks of one process sharing one client, each one call at a time
  (submissions that arrive together share a transaction, docs/scaling.md);
- the floor: the same number of one-row ``INSERT``s into a table of three columns, one
  psycopg connection (autocommit), one after another: what one durable statement costs
  from Python here with nothing of Veracity's;
- the statements alone (where ``pgbench`` is installed, ``--pgbench-seconds`` each, 0
  skips): the submission's statement (queries.sql's ``execution_submit``, its parameters
  written in: a new id ordered by time as Veracity's are, no key, no worker's offer out)
  and the same one-row ``INSERT``, each sent by ``pgbench -n -M prepared -c 1``, a C
  client, one call after another: what a call costs PostgreSQL and the round trip with no
  Python at all, the least any one caller of that statement can take.

Each is run ``--rounds`` times, alternating, on one scratch database; the figures are
listed per round with their median. The CPU figures are the process's own, so the
database's share of the two cores does not enter them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time

import psycopg

from bench._util import scratch_pg_database
from veracity import AsyncDatabaseClient
from veracity.store import open_store
from veracity.store._sql import load_queries

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


# The submission's parameters as literals: an id whose first 48 bits are the time in
# milliseconds (so that ids grow as Veracity's do, veracity/_ids.py), the rest random
SUBMISSION_LITERALS = {
    "id": "(lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')"
          " || substr(md5(random()::text), 1, 20))::uuid",
    # pgbench reads ":name" as a variable, even inside a literal: the colon as chr(58)
    "ffqn": "(" + " || chr(58) || ".join(f"'{part}'" for part in FFQN.split(":")) + ")",
    "params": "'[\"noop\", \"k\"]'",
    "paused": "false",
    "deployment_id": "'bench'",
    "parent_id": "NULL",
    "join_set": "NULL",
    "idempotency_key": "NULL",
    "request_digest": "NULL",
    "scheduled_at": "NULL",
    "now": "NULL",
}


def submission_script() -> str:
    """queries.sql's ``execution_submit`` with :data:`SUBMISSION_LITERALS` written in."""
    statement = load_queries("veracity.store.postgres")["execution_submit"]
    written = re.sub(r"%\((\w+)\)s", lambda m: SUBMISSION_LITERALS[m.group(1)], statement)
    return written + ";\n"


PLAIN_SCRIPT = "INSERT INTO bench_plain (kind, key) VALUES ('noop', 'k');\n"


def pgbench(url: str, script: str, seconds: float) -> float:
    """Milliseconds a call of ``script``, one connection, prepared, for ``seconds``."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as f:
        f.write(script)
        f.flush()
        done = subprocess.run(["pgbench", "-n", "-M", "prepared", "-c", "1", "-T",
                               str(max(1, round(seconds))), "-f", f.name, url],
                              capture_output=True, text=True, check=True)
    found = re.search(r"latency average = ([0-9.]+) ms", done.stdout)
    if found is None:
        raise RuntimeError(f"pgbench said no latency: {done.stdout}{done.stderr}")
    return float(found.group(1))


def statements(url: str, seconds: float, rounds: int) -> dict[str, list[float]]:
    """Each round, the submission's statement then the plain ``INSERT`` (ms a call)."""
    out: dict[str, list[float]] = {"submit": [], "plain": []}
    script = submission_script()
    for _ in range(rounds):
        out["submit"].append(pgbench(url, script, seconds))
        out["plain"].append(pgbench(url, PLAIN_SCRIPT, seconds))
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
    parser.add_argument("--pgbench-seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.submissions < 1 or args.rounds < 1:
        parser.error("--submissions and --rounds must be at least 1")
    if not 1 <= args.callers <= args.submissions:
        parser.error("--callers must be between 1 and --submissions")
    if args.pgbench_seconds < 0:
        parser.error("--pgbench-seconds must be 0 (skip) or more")
    alone: dict[str, list[float]] | None = None
    with scratch_pg_database() as url:
        got = asyncio.run(run(url, args.submissions, args.callers, args.rounds))
        if args.pgbench_seconds and shutil.which("pgbench"):
            alone = statements(url, args.pgbench_seconds, args.rounds)
    print(f"single submissions on PostgreSQL, {args.submissions} per round, median of "
          f"{args.rounds} (load average {os.getloadavg()[0]:.1f}):")
    print("  " + _line("AsyncDatabaseClient, one caller", got["one"]))
    print("  " + _line(f"AsyncDatabaseClient, {args.callers} callers at once", got["many"]))
    print("  " + _line("plain INSERT, psycopg, one caller", got["plain"]))
    if alone is None:
        print("  the statements alone: not measured (pgbench is not installed, or "
              "--pgbench-seconds 0)")
        return
    for name, what in (("the submission's statement alone", "submit"),
                       ("the plain INSERT alone", "plain")):
        ms = statistics.median(alone[what])
        each = ", ".join(f"{v:.3f}" for v in alone[what])
        print(f"  {name} (pgbench, C client, prepared, one connection, "
              f"{args.pgbench_seconds:g} s a round): {ms:.3f} ms a call, {1000 / ms:,.0f}/s "
              f"({each} ms)")


if __name__ == "__main__":
    main()
