"""How long the dashboard takes to render its heaviest pages on the server
(docs/dashboard.md), on PostgreSQL and on SQLite.

Two databases' worth of data, then ``--requests`` sequential requests per page through the
ASGI app in-process (httpx's ASGI transport: no sockets, so what is measured is the
server's own time: routing, the store's queries, the templates), after 10 warm-up
requests; median, p95 and the slowest:

* **list**: ``GET /ui/executions`` over 10,000 executions (``--executions``): the first
  page of 50, the counts of what needs a person (a count by status over all 10,000, the
  flag counts, the deployments' stranded ones), the page's waiting reasons;
* **list, 200 a page, filtered**: ``GET /ui/executions?status=completed&limit=200``;
* **history**: ``GET /ui/executions/{id}`` of an execution with 5,000 history events
  (``--events``): its header, the first 100 events, the count of each kind over all
  5,000, its children;
* **history, a later page filtered by kind**:
  ``?kind=message_arrived&after=4800``.

On PostgreSQL the executions are inserted with one SQL statement (a quarter completed);
on SQLite through the store (a quarter completed by a claim and a completion). The 5,000
events are messages sent through the store (``message_arrived`` events) on both.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
import psycopg

from bench._util import scratch_pg_database
from veracity.api import create_api
from veracity.control import ExecutionService
from veracity.examples import shop
from veracity.models import Claim, NewExecution
from veracity.store import Store, open_store

FFQN = "shop:orders/process.run"
DEPLOYMENT = "bench"
TARGET_MS = 200.0


def insert_pg(url: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            WITH ins AS (
                INSERT INTO veracity_executions (id, ffqn, params, status, result,
                    deployment_id, scheduled_at, created_at, updated_at, history_seq)
                SELECT gen_random_uuid(), %s, '["o", 1]',
                       CASE WHEN g %% 4 = 0 THEN 'completed' ELSE 'pending' END,
                       CASE WHEN g %% 4 = 0 THEN '{"receipt": "r"}'::json END, %s,
                       now(), now() - make_interval(secs => %s - g), now(), 1
                FROM generate_series(1, %s) g
                RETURNING id, created_at
            )
            INSERT INTO veracity_history (execution_id, seq, kind, at, data)
            SELECT id, 1, 'pending', created_at, '{}' FROM ins
            """,
            [FFQN, DEPLOYMENT, n, n],
        )


async def insert_through_store(store: Store, n: int) -> None:
    for i in range(n):
        await store.execution_submit(NewExecution(
            ffqn=FFQN, params=["o", i], deployment_id=DEPLOYMENT, id=uuid.uuid4()))
    done = 0
    while done < n // 4:
        claimed = await store.execution_claim("bench", [FFQN], limit=min(500, n // 4 - done),
                                              lease_ttl=timedelta(seconds=60),
                                              deployment_id=DEPLOYMENT)
        if not claimed:
            break
        for e in claimed:
            assert e.lease_owner is not None
            await store.execution_complete_if_owned(
                Claim(e.id, e.lease_owner, e.lease_epoch), {"receipt": "r"})
        done += len(claimed)


async def long_history(store: Store, events: int) -> uuid.UUID:
    submitted = await store.execution_submit(NewExecution(
        ffqn=FFQN, params=["long", 1], deployment_id=DEPLOYMENT, id=uuid.uuid4()))
    ident = submitted.execution.id
    for i in range(events - 1):
        await store.message_send(ident, f"topic-{i % 7}", {"n": i, "text": "x" * 40})
    return ident


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[max(0, int(len(ordered) * 0.95) - 1)]
    return (f"median {statistics.median(ordered) * 1000:6.1f} ms, p95 {p95 * 1000:6.1f} ms, "
            f"max {ordered[-1] * 1000:6.1f} ms")


async def timed(client: httpx.AsyncClient, path: str, n: int) -> list[float]:
    samples: list[float] = []
    for i in range(n + 10):
        start = time.perf_counter()
        response = await client.get(path)
        elapsed = time.perf_counter() - start
        if response.status_code != 200:
            raise SystemExit(f"{path}: {response.status_code} {response.text[:300]}")
        if i >= 10:
            samples.append(elapsed)
    return samples


async def measure(database_url: str, backend: str, executions: int, events: int,
                  requests: int) -> list[str]:
    store = await open_store(database_url)
    lines: list[str] = []
    try:
        await store.migrate()
        start = time.perf_counter()
        if backend == "postgresql":
            insert_pg(database_url, executions)
        else:
            await insert_through_store(store, executions)
        ident = await long_history(store, events)
        seeded = time.perf_counter() - start
        service = ExecutionService(store, workflows=set(shop.app.workflows),
                                   deployment_id=DEPLOYMENT)
        transport = httpx.ASGITransport(app=create_api(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            pages = [
                (f"list of {executions:,}", "/ui/executions"),
                ("list, 200 a page, filtered", "/ui/executions?status=completed&limit=200"),
                (f"history of {events:,} events", f"/ui/executions/{ident}"),
                ("history, later page by kind",
                 f"/ui/executions/{ident}?kind=message_arrived&after={events - 200}"),
            ]
            for name, path in pages:
                samples = await timed(client, path, requests)
                verdict = "ok" if statistics.median(samples) * 1000 < TARGET_MS else "OVER"
                lines.append(f"dashboard {backend:10}  {name:30} {_ms(samples)}  "
                             f"(< {TARGET_MS:.0f} ms: {verdict})")
        lines.append(f"dashboard {backend:10}  (seeded in {seeded:.1f} s)")
    finally:
        await store.close()
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--executions", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=5_000)
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args(argv)
    with scratch_pg_database() as url:
        for line in asyncio.run(measure(url, "postgresql", args.executions, args.events,
                                        args.requests)):
            print(line, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for line in asyncio.run(measure(f"sqlite:///{Path(tmp) / 'bench.db'}", "sqlite",
                                        args.executions, args.events, args.requests)):
            print(line, flush=True)


if __name__ == "__main__":
    main()
