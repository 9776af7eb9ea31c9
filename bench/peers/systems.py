"""The systems compared: how each one's schema is made, how a job is submitted (one call
each, through its documented public API), how its worker process is started, and how many
of its jobs are left. The peers are imported only here and in ``worker.py``, inside
functions: they are installed in ``.venv-peers`` (``make bench-peers``), never in ``.venv``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 5.0  # every system's lease / heartbeat / recovery threshold in the kill -9 test

Submit = Callable[[str, str], Coroutine[Any, Any, None]]

PLAIN_SCHEMA = """
CREATE TABLE plain_jobs (
    id bigserial PRIMARY KEY,
    kind text NOT NULL,
    key text NOT NULL,
    locked_until timestamptz
);
CREATE FUNCTION plain_notify() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN PERFORM pg_notify('plain_jobs', ''); RETURN NULL; END $$;
CREATE TRIGGER plain_jobs_notify AFTER INSERT ON plain_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION plain_notify();
"""


@dataclass(frozen=True)
class System:
    name: str  # as in the table
    kind: str  # plain, veracity, pgqueuer, procrastinate, dbos
    remaining_sql: str  # jobs not finished yet
    table: str  # the table of its jobs, which every worker reads to take one
    has_steps: bool = False
    dbos_polling: float = 1.0
    settings: tuple[tuple[str, str], ...] = ()
    """Veracity: settings of its worker processes beyond the defaults (environment)."""
    via: str = "http"
    """Veracity: how jobs are submitted: ``http``, :class:`veracity.AsyncClient` through a
    ``veracity server``; ``database``, :class:`veracity.AsyncDatabaseClient` (as every
    peer's client, straight to the database)."""

    def worker_argv(self, url: str, job: str, recovery: bool) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        if self.kind == "veracity":
            env.update(VERACITY_DATABASE_URL=url, VERACITY_APP="bench.peers.vapp:app",
                       VERACITY_DEPLOYMENT_ID="bench", VERACITY_LOG_LEVEL="warning")
            env.update(self.settings)
            if recovery:
                env.update(VERACITY_LEASE_TTL=f"{LEASE_SECONDS:g}s",
                           VERACITY_RECOVERY_INTERVAL="1s")
            veracity = str(Path(sys.executable).parent / "veracity")
            return [veracity, "worker"], env
        argv = [sys.executable, "-m", "bench.peers.worker", self.kind, job, url,
                "--dbos-polling", str(self.dbos_polling)]
        if recovery:
            argv.append("--recovery")
        return argv, env

    async def setup(self, url: str) -> None:
        if self.kind == "plain":
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute(PLAIN_SCHEMA.encode())
        elif self.kind == "veracity":
            from veracity.store import open_store

            store = await open_store(url)
            await store.migrate()
            await store.close()
        elif self.kind == "pgqueuer":
            from pgqueuer import PsycopgDriver, Queries

            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await Queries(PsycopgDriver(conn)).install()
        elif self.kind == "procrastinate":
            app = procrastinate_app(url)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()
        elif self.kind == "dbos":
            # the documented way to create DBOS's system tables before a client enqueues
            dbos = str(Path(sys.executable).parent / "dbos")
            subprocess.run([dbos, "migrate", "--sys-db-url", url], check=True,
                           capture_output=True)

    @asynccontextmanager
    async def submitter(self, url: str, job: str, callers: int = 1) -> AsyncIterator[Submit]:
        """``submit(job_kind, key)``: one job per call, durable when it returns; ``callers``
        may call it at once (the plain queue and PGQueuer get a connection per caller; the
        others share their clients' own pools, at their defaults)."""
        if self.kind == "plain":
            async with connections(url, callers) as idle:
                async def plain(kind: str, key: str) -> None:
                    conn = await idle.get()
                    try:
                        await conn.execute(
                            "INSERT INTO plain_jobs (kind, key) VALUES (%s, %s)", [kind, key])
                    finally:
                        idle.put_nowait(conn)
                yield plain
        elif self.kind == "veracity" and self.via == "database":
            from veracity import AsyncDatabaseClient

            os.environ["VERACITY_DEPLOYMENT_ID"] = "bench"  # the workers' (worker_argv)
            try:
                async with AsyncDatabaseClient(url, app="bench.peers.vapp:app") as direct:
                    yield veracity_submit(direct)
            finally:
                del os.environ["VERACITY_DEPLOYMENT_ID"]
        elif self.kind == "veracity":
            from bench._util import server
            from veracity import AsyncClient

            with server(url, app="bench.peers.vapp:app",
                        extra_env={"VERACITY_DEPLOYMENT_ID": "bench"}) as base:
                async with AsyncClient(base, timeout=60) as client:
                    yield veracity_submit(client)
        elif self.kind == "pgqueuer":
            import asyncpg
            from pgqueuer import AsyncpgDriver, Queries

            # asyncpg, as its docs use it (bench/peers/worker.py), a connection per caller
            opened = [await asyncpg.connect(url) for _ in range(callers)]
            idle = asyncio.Queue[Any]()
            for conn in opened:
                idle.put_nowait(Queries(AsyncpgDriver(conn)))
            try:
                async def pgqueuer(kind: str, key: str) -> None:
                    queries = await idle.get()
                    try:
                        await queries.enqueue("job",
                                              json.dumps({"kind": kind, "key": key}).encode())
                    finally:
                        idle.put_nowait(queries)
                yield pgqueuer
            finally:
                for conn in opened:
                    await conn.close()
        elif self.kind == "procrastinate":
            app = procrastinate_app(url)
            async with app.open_async():
                task = app.tasks["job"]

                async def procrastinate(kind: str, key: str) -> None:
                    await task.defer_async(kind=kind, key=key)
                yield procrastinate
        elif self.kind == "dbos":
            from dbos import DBOSClient

            client = DBOSClient(system_database_url=url)
            try:
                async def dbos(kind: str, key: str) -> None:
                    if kind == "steps":
                        await client.enqueue_async(
                            {"queue_name": "bench", "workflow_name": "three_steps"}, key)
                    else:
                        await client.enqueue_async(
                            {"queue_name": "bench", "workflow_name": "job"}, kind, key)
                yield dbos
            finally:
                client.destroy()


def veracity_submit(client: Any) -> Submit:
    """A job per call through either Veracity client (``AsyncClient`` or
    ``AsyncDatabaseClient``: the same ``submit``)."""
    async def submit(kind: str, key: str) -> None:
        if kind == "steps":
            await client.submit("bench:peers/steps.fn", key)
        else:
            await client.submit("bench:peers/job.fn", kind, key)
    return submit


@asynccontextmanager
async def connections(url: str, n: int) -> AsyncIterator[asyncio.Queue[Any]]:
    """``n`` open connections (autocommit), in a queue of idle ones."""
    idle: asyncio.Queue[Any] = asyncio.Queue()
    opened = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(n)]
    for conn in opened:
        idle.put_nowait(conn)
    try:
        yield idle
    finally:
        for conn in opened:
            await conn.close()


def procrastinate_app(url: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="job")
    async def job(kind: str, key: str) -> None:
        from bench.peers import jobs

        await jobs.run(kind, key)

    return app


SYSTEMS = [
    System("plain SKIP LOCKED", "plain", "SELECT count(*) FROM plain_jobs", "plain_jobs"),
    System("Veracity (HTTP client)", "veracity",
           "SELECT count(*) FROM veracity_executions WHERE status <> 'completed'",
           "veracity_executions",
           has_steps=True),
    System("Veracity (database client)", "veracity",
           "SELECT count(*) FROM veracity_executions WHERE status <> 'completed'",
           "veracity_executions",
           has_steps=True, via="database"),
    # The settings docs/scaling.md ("Settings for short workflows") recommends for a host
    # of workers running short async workflows: worker.concurrency 512 (each claim of at
    # most 128, as at the default) instead of the default 256
    System("Veracity (tuned: concurrency 512, database client)", "veracity",
           "SELECT count(*) FROM veracity_executions WHERE status <> 'completed'",
           "veracity_executions",
           has_steps=True, via="database",
           settings=(("VERACITY_WORKER_CONCURRENCY", "512"),)),
    System("PGQueuer", "pgqueuer", "SELECT count(*) FROM pgqueuer", "pgqueuer"),
    System("Procrastinate", "procrastinate",
           "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
           "procrastinate_jobs"),
    System("DBOS (default 1 s polling)", "dbos",
           "SELECT count(*) FROM dbos.workflow_status WHERE status IN ('ENQUEUED', 'PENDING')",
           "dbos.workflow_status",
           has_steps=True, dbos_polling=1.0),
    System("DBOS (10 ms polling)", "dbos",
           "SELECT count(*) FROM dbos.workflow_status WHERE status IN ('ENQUEUED', 'PENDING')",
           "dbos.workflow_status",
           has_steps=True, dbos_polling=0.01),
]
