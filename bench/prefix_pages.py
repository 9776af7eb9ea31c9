"""List pages of an FFQN prefix shared by many workflows, on SQLite and PostgreSQL
(docs/operations.md, What a list page costs).

A prefix is read workflow by workflow and status by status from the (workflow, status)
index: the more workflows share it, the more reads a page takes. Each backend gets
``--rows`` executions (default 400,000), created over 40 days: 99 % of them spread over
``--workflows`` workflows named ``app:w000/run.run``, ``app:w001/run.run``, ... (default
200), 1 % over as many ``lib:`` workflows; 99 % ``completed``, 1 % ``failed``. Then,
through the store (``execution_list``, in process: the queries, not HTTP), the median of
20 calls after 3 warm-ups of each page below.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

from bench._util import scratch_pg_database
from veracity.core.states import Status
from veracity.models import ExecutionFilter, ListCursor
from veracity.store import open_store
from veracity.store.protocol import Store

PAGES: list[tuple[str, ExecutionFilter]] = [
    ("ffqn_prefix=app: (most rows)", ExecutionFilter(ffqn_prefix="app:")),
    ("ffqn_prefix=lib: (1 % of the rows)", ExecutionFilter(ffqn_prefix="lib:")),
    ("status=failed&ffqn_prefix=app:",
     ExecutionFilter(statuses=(Status.FAILED,), ffqn_prefix="app:")),
    ("status=failed&ffqn_prefix=lib:",
     ExecutionFilter(statuses=(Status.FAILED,), ffqn_prefix="lib:")),
    ("ffqn_prefix=app:w007/ (one workflow)", ExecutionFilter(ffqn_prefix="app:w007/")),
]
"""Each page measured (its name, its filter); each also after its first page's last row."""

SQLITE_FILL = """
WITH RECURSIVE g (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < :rows)
INSERT INTO veracity_executions (
    id, ffqn, params, status, result, deployment_id, scheduled_at, created_at, updated_at,
    history_seq)
SELECT printf('%08x-0000-4000-8000-%012x', i, i * 7919),
       CASE WHEN i % 100 = 0 THEN 'lib:w' || printf('%03d', (i / 100) % :workflows)
            ELSE 'app:w' || printf('%03d', i % :workflows) END || '/run.run',
       '[]',
       CASE WHEN i % 97 = 0 THEN 'failed' ELSE 'completed' END,
       CASE WHEN i % 97 = 0 THEN NULL ELSE '1' END,
       'dep-' || (i % 3), t, t, t, 3
FROM (SELECT i, :start + i * :step AS t FROM g)
"""

PG_FILL = """
INSERT INTO veracity_executions (
    id, ffqn, params, status, result, deployment_id, scheduled_at, created_at, updated_at,
    history_seq)
SELECT (lpad(to_hex(i), 8, '0') || '-0000-4000-8000-'
        || lpad(to_hex(i::bigint * 7919), 12, '0'))::uuid,
       CASE WHEN i %% 100 = 0 THEN 'lib:w' || lpad(((i / 100) %% %(workflows)s)::text, 3, '0')
            ELSE 'app:w' || lpad((i %% %(workflows)s)::text, 3, '0') END || '/run.run',
       '[]',
       CASE WHEN i %% 97 = 0 THEN 'failed' ELSE 'completed' END,
       CASE WHEN i %% 97 = 0 THEN NULL ELSE '1'::json END,
       'dep-' || (i %% 3), t, t, t, 3
FROM generate_series(1, %(rows)s) AS i,
     LATERAL (SELECT now() - interval '40 days'
                     + (i / %(rows)s::float8) * interval '40 days' AS t) AS at
"""


async def _migrated(url: str) -> None:
    store = await open_store(url)
    try:
        await store.migrate()
    finally:
        await store.close()


def fill_sqlite(path: Path, rows: int, workflows: int) -> None:
    asyncio.run(_migrated(f"sqlite:///{path}"))
    now_us = int(time.time() * 1_000_000)
    span = 40 * 86_400 * 1_000_000
    with sqlite3.connect(path) as conn:
        conn.execute(SQLITE_FILL, {"rows": rows, "workflows": workflows,
                                   "start": now_us - span, "step": span // rows})


def fill_pg(url: str, rows: int, workflows: int) -> None:
    asyncio.run(_migrated(url))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(PG_FILL, {"rows": rows, "workflows": workflows})
        conn.execute("VACUUM ANALYZE veracity_executions")


async def _median_ms(store: Store, filter: ExecutionFilter, after: ListCursor | None,
                     calls: int = 20) -> tuple[float, int]:
    for _ in range(3):
        page = await store.execution_list(filter, limit=50, after=after)
    took = []
    for _ in range(calls):
        started = time.perf_counter()
        page = await store.execution_list(filter, limit=50, after=after)
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000, len(page)


async def measure(url: str) -> list[tuple[str, float, float, int]]:
    """Each page's first and second page, median ms, and the first page's rows."""
    store = await open_store(url, pool_size=1)
    out = []
    try:
        for name, filter in PAGES:
            first, rows = await _median_ms(store, filter, None)
            page = await store.execution_list(filter, limit=50)
            after = ListCursor(page[-1].created_at, page[-1].id) if page else None
            second = (await _median_ms(store, filter, after))[0] if after else 0.0
            out.append((name, first, second, rows))
    finally:
        await store.close()
    return out


def report(backend: str, pages: list[tuple[str, float, float, int]]) -> None:
    for name, first, second, rows in pages:
        print(f"prefix   {backend:<10}  {name}: first page {first:.2f} ms ({rows} rows), "
              f"the next {second:.2f} ms")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--workflows", type=int, default=200)
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args(argv)
    backends = {b.strip() for b in args.backends.split(",")}
    print(f"prefix   {args.rows:,} executions: {args.workflows} workflows share app: "
          f"(99 % of the rows), {args.workflows} share lib: (1 %)")
    if "sqlite" in backends:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "prefix.db"
            fill_sqlite(path, args.rows, args.workflows)
            report("sqlite", asyncio.run(measure(f"sqlite:///{path}")))
    if "postgresql" in backends:
        with scratch_pg_database() as url:
            fill_pg(url, args.rows, args.workflows)
            report("postgresql", asyncio.run(measure(url)))


if __name__ == "__main__":
    main()
