"""Batch submissions through the API (``POST /v1/executions/batch``), on PostgreSQL and
SQLite, and what one call of the Python client costs.

One ``veracity server`` process at its default settings (PostgreSQL: no in-process
worker, so nothing is claimed meanwhile); ``--clients`` asyncio loops of
``veracity.AsyncClient.submit_many`` each send batches of ``--batch`` submissions (the
example shop's ``shop:orders/process.run``, each with its own idempotency key) for
``--seconds``. Every batch is one durable transaction: its rows and their first events are
committed before the answer. Executions/s = executions answered / elapsed wall time; the
count in the database is checked against it afterwards.

Also ``Client.submit`` one at a time from one blocking client (``--single`` seconds):
single durable submissions through the Python client, as a script would make them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid

from bench._util import process_cpu, scratch_pg_database, server

FFQN = "shop:orders/process.run"


async def _batches(url: str, seconds: float, clients: int, size: int
                   ) -> tuple[int, float, list[float]]:
    from veracity import AsyncClient, Submission

    done = 0
    latencies: list[float] = []
    async with AsyncClient(url, timeout=60) as client:
        await client.submit_many([Submission(FFQN, ["warm-up", 1])])  # connections, caches

        async def loop(n: int) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                batch = [Submission(FFQN, [f"o-{n}-{i}", i], idempotency_key=uuid.uuid4().hex)
                         for i in range(size)]
                began = time.perf_counter()
                answered = await client.submit_many(batch)
                latencies.append(time.perf_counter() - began)
                done += len(answered)

        started = time.perf_counter()
        deadline = started + seconds
        await asyncio.gather(*(loop(n) for n in range(clients)))
        return done, time.perf_counter() - started, latencies


def _singles(url: str, seconds: float) -> tuple[int, float]:
    from veracity import Client

    with Client(url, timeout=30) as client:
        client.submit(FFQN, "warm-up", 1)
        done = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            client.submit(FFQN, f"o-{done}", done)
            done += 1
        return done, time.perf_counter() - started


async def _count(database_url: str) -> int:
    from veracity.models import ExecutionFilter
    from veracity.store import open_store

    store = await open_store(database_url)
    try:
        total = 0
        after = None
        while True:
            page = await store.execution_list(ExecutionFilter(), limit=10_000, after=after)
            total += len(page)
            if len(page) < 10_000:
                return total
            from veracity.models import ListCursor

            after = ListCursor(page[-1].created_at, page[-1].id)
    finally:
        await store.close()


def measure(database_url: str, label: str, args: argparse.Namespace) -> None:
    pids: list[int] = []
    with server(database_url, pids=pids) as url:
        before = process_cpu(pids[0])
        done, elapsed, latencies = asyncio.run(
            _batches(url, args.seconds, args.clients, args.batch))
        cpu = process_cpu(pids[0]) - before
        p50 = statistics.median(latencies) * 1000
        p99 = sorted(latencies)[int(len(latencies) * 0.99)] * 1000 if latencies else 0.0
        print(f"batch submissions, {label}: {done / elapsed:,.0f} executions/s ({done:,} in "
              f"{elapsed:.1f} s; batches of {args.batch}, {args.clients} clients; a batch "
              f"p50 {p50:.0f} ms, p99 {p99:.0f} ms; the server's CPU {cpu / done * 1e6:.0f} µs an "
              f"execution) (target >= 20,000/s; load average {os.getloadavg()[0]:.1f})")
        singles = 0
        if args.single > 0:  # --single 0: batches only
            singles, took = _singles(url, args.single)
            print(f"single submissions through Client.submit, one client, {label}: "
                  f"{singles / took:,.0f}/s ({took / singles * 1000:.2f} ms a call)")
    stored = asyncio.run(_count(database_url))
    # and the warm-ups: the batches' and the singles'
    expected = done + singles + (2 if args.single > 0 else 1)
    if stored != expected:
        raise SystemExit(f"{label}: {stored} executions stored, {expected} answered")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--single", type=float, default=5.0,
                        help="seconds of single submissions through Client.submit "
                             "(0: none)")
    parser.add_argument("--sqlite", action="store_true", help="also on SQLite")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.single < 0 or args.clients < 1 or not 1 <= args.batch <= 1000:
        parser.error("--seconds must be positive, --single not negative, --clients at least 1 "
                     "and --batch from 1 to 1000")
    with scratch_pg_database() as url:
        measure(url, "PostgreSQL", args)
    if args.sqlite:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            measure(f"sqlite:///{folder}/veracity.db", "SQLite", args)


if __name__ == "__main__":
    main()
