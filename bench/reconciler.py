"""The reconciler on PostgreSQL: one tick (``ReconcilerService.run_once``) over many running
executions delegated to a fake n8n whose every API answer comes after 5 ms.

Set-up (not timed): the fake n8n (``veracity.testing.fake_n8n``) runs in a process of its
own (so that it does not share the benchmark's GIL), on uvicorn, with ``latency=0.005`` (each
request sleeps 5 ms before it is answered). Its CLI cannot preload runs and its control API
cannot create runs in bulk, so the fake process is this module's ``--serve-fake`` entry:
``FakeN8n.start_runs`` creates the runs in memory (no HTTP), then ``create_app`` is served by
``uvicorn.run`` exactly as ``python -m veracity.testing.fake_n8n`` serves it. Runs that are
"still running" follow ``Script.forever()``; runs that "finished without a callback" end with
success at once and their trigger body carries no callback block (n8n: success, stoppedAt
set, nobody told Veracity). Each scenario gets a scratch database, migrated, into which the
running delegated executions are bulk-inserted with SQL (status running, engine n8n, the
fake's run id as external_execution_id, triggered_at now(), no lease, history rows pending,
running, trigger_sending, external_started); the limit (max_duration) is one hour, so no
limit is breached and nothing is stopped.

Measured: the wall time of one ``run_once`` (lock connection, advisory lock, db_now, every
page of ``execution_external_running`` (1000 per page), every engine GET, every
``execution_reconcile_apply``, unlock), with a fresh store (pool of 10, as the server opens
it) and a fresh ``N8nEngine`` built the way the server builds it (``N8nEngine(config)``:
httpx pool of at most 64 connections, engine timeout 10 s). The tick runs on the standard
asyncio loop, like ``veracity server``; the reconciler's log records are made but not
printed. Reported with it:

- engine requests per second: the ``N8nEngine.inspect`` calls answered, over the wall time;
- the benchmark process's CPU time during the tick (``time.process_time``), and the part of
  the wall time spent waiting on the store's calls (that includes turning rows into
  ``Execution`` objects);
- database round trips: every statement the store sent during the tick, counted by wrapping
  ``PostgresStore._fetchall`` (one statement each), the statements ``_drive`` executes inside
  ``PostgresStore._op``, plus the BEGIN and COMMIT of each ``_op`` transaction, plus the two
  statements of ``single_runner`` (pg_try_advisory_lock, pg_advisory_unlock) on its own
  connection. Each is one round trip (psycopg sends a statement's parse/bind/execute as one
  exchange). pg_stat_statements is not used: it needs shared_preload_libraries, which the
  benchmark does not control. New connections (the lock's, and any the pool opens) are
  counted apart.

Scenarios: (1) 10,000 executions, all runs still going within their limit (inspect each,
nothing to write); (2) 10,000 of which 1,000 runs finished without a callback (the tick
writes failed_transient for those, in one transaction per page; checked afterwards in the
database); (3) 100,000, all still going. Each at the default concurrency bound (16) and at a
higher one (``--high``, default 64, the most the adapter's own pool of 64 connections can
use). Targets (issue 5): 10,000 under 5 s, 100,000 under 60 s. To keep the whole run within
about five minutes, a tick still going after its budget (``--budget`` 40 s for 10,000,
``--large-budget`` 60 s for 100,000) is cancelled and reported as NOT FINISHED with its
rate so far and the tick time that rate implies.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench._util import free_port, scratch_pg_database
from bench.workers import migrate
from veracity.store import RunnerLock

ROOT = Path(__file__).resolve().parent.parent
FFQN = "bench:n8n/run.ext"
API_KEY = "bench-n8n-api-key"
LATENCY = 0.005
LIMIT_SECONDS = 3600.0


# --------------------------------------------------------------------------------------------
# The fake n8n, in a process of its own


def serve_fake(port: int, latency: float, going: int, finished: int) -> None:
    """The child process: a FakeN8n with ``going`` runs that never end (ids 1..going) and
    ``finished`` runs already ended by success without a callback (the next ids)."""
    import uvicorn

    from veracity.testing.fake_n8n import FakeN8n, Script, create_app

    fake = FakeN8n(api_key=API_KEY, latency=latency)
    fake.add_webhook("bench/going", Script.forever())
    fake.add_webhook("bench/done", Script(steps=(), outcome="success", result=None))
    going_ids = fake.start_runs("bench/going", [{"execution_id": f"g{i}"} for i in range(going)])
    done_ids = fake.start_runs("bench/done", [{"execution_id": f"d{i}"} for i in range(finished)])
    assert going_ids == [str(i) for i in range(1, going + 1)], "ids are not 1..going"
    assert done_ids == [str(i) for i in range(going + 1, going + finished + 1)]
    print(json.dumps({"going": [1, going], "finished": [going + 1, going + finished]}),
          flush=True)
    uvicorn.run(create_app(fake), host="127.0.0.1", port=port, log_level="warning",
                access_log=False, ws="none", timeout_graceful_shutdown=2)


@contextmanager
def fake_n8n(going: int, finished: int, latency: float) -> Iterator[str]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    errors = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe nobody drains
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.reconciler", "--serve-fake", str(port),
         "--fake-latency", str(latency), "--fake-going", str(going),
         "--fake-finished", str(finished)],
        env=env, stdout=subprocess.PIPE, stderr=errors, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once every run is created
        if not line:
            proc.wait()
            errors.seek(0)
            raise SystemExit(f"the fake n8n did not start: {errors.read()[-2000:]}")
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/_fake/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the fake n8n did not answer")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        errors.close()


# --------------------------------------------------------------------------------------------
# The database


def insert_delegated(url: str, first: int, last: int) -> None:
    """Running executions delegated to n8n with external ids first..last, and their history."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            WITH ins AS (
                INSERT INTO veracity_executions (id, ffqn, params, status, deployment_id,
                    scheduled_at, created_at, updated_at, history_seq, engine,
                    external_execution_id, triggered_at, callback_token_hash)
                SELECT gen_random_uuid(), %(ffqn)s, '[]', 'running', 'bench',
                       now(), now(), now(), 4, 'n8n', g::text, now(), md5(g::text)
                FROM generate_series(%(first)s::int, %(last)s::int) g
                RETURNING id, created_at, external_execution_id
            )
            INSERT INTO veracity_history (execution_id, seq, kind, at, data)
            SELECT ins.id, s.seq, s.kind, ins.created_at,
                   CASE s.kind
                       WHEN 'trigger_sending' THEN json_build_object('engine', 'n8n')
                       WHEN 'external_started' THEN json_build_object(
                           'external_execution_id', ins.external_execution_id,
                           'by', 'worker')
                       ELSE '{}'::json END
            FROM ins CROSS JOIN (VALUES (1, 'pending'), (2, 'running'),
                                        (3, 'trigger_sending'), (4, 'external_started'))
                 AS s (seq, kind)
            """,
            {"ffqn": FFQN, "first": first, "last": last},
        )
        conn.execute("ANALYZE veracity_executions")
        conn.execute("ANALYZE veracity_history")


def count_status(url: str, status: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM veracity_executions WHERE status = %s",
                           [status]).fetchone()
        assert row is not None
        return int(row[0])


# --------------------------------------------------------------------------------------------
# One tick, with its statements counted


@dataclass
class Tick:
    executions: int
    concurrency: int
    seconds: float
    cpu_seconds: float
    db_seconds: float
    engine_requests: int
    statements: int
    transactions: int
    connections: int
    actions: int
    engine_errors: int
    finished: bool = True  # False: cancelled at the time budget, figures up to then

    @property
    def rate(self) -> float:
        return self.engine_requests / self.seconds


@asynccontextmanager
async def counting_statements() -> AsyncIterator[dict[str, float]]:
    """Count the store's statements, and the time spent waiting for them, while the block
    runs (see the module docstring)."""
    from veracity.store.postgres import store as pg_store

    counts: dict[str, float] = {"statements": 0, "transactions": 0, "connections": 0,
                                "db_seconds": 0.0}
    cls = pg_store.PostgresStore
    orig_fetchall, orig_op, orig_drive = cls._fetchall, cls._op, pg_store._drive
    orig_single = cls.single_runner
    orig_connect = psycopg.AsyncConnection.connect

    async def fetchall(self: Any, name: str, params: Any, *rows: Any) -> Any:
        counts["statements"] += 1
        started = time.perf_counter()
        try:
            return await orig_fetchall(self, name, params, *rows)
        finally:
            counts["db_seconds"] += time.perf_counter() - started

    async def op(self: Any, factory: Any, *, transaction: bool = True) -> Any:
        counts["transactions"] += 1
        if transaction:
            counts["statements"] += 2  # BEGIN, COMMIT
        started = time.perf_counter()
        try:
            return await orig_op(self, factory, transaction=transaction)
        finally:
            counts["db_seconds"] += time.perf_counter() - started

    async def drive(conn: Any, generator: Any) -> Any:
        def counted() -> Any:
            try:
                query = next(generator)
                while True:
                    counts["statements"] += 1
                    rows = yield query
                    query = generator.send(rows)
            except StopIteration as stop:
                return stop.value

        return await orig_drive(conn, counted())

    @asynccontextmanager
    async def single(self: Any, name: str) -> AsyncIterator[RunnerLock]:
        counts["statements"] += 2  # lock_try, lock_release
        started = time.perf_counter()
        manager = orig_single(self, name)
        acquired = await manager.__aenter__()
        counts["db_seconds"] += time.perf_counter() - started
        try:
            yield acquired
        except BaseException as exc:
            started = time.perf_counter()
            if not await manager.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            started = time.perf_counter()
            await manager.__aexit__(None, None, None)
        finally:
            counts["db_seconds"] += time.perf_counter() - started

    async def connect(*args: Any, **kwargs: Any) -> Any:
        counts["connections"] += 1
        return await orig_connect(*args, **kwargs)

    cls._fetchall = fetchall  # type: ignore[method-assign,assignment]
    cls._op = op  # type: ignore[method-assign]
    pg_store._drive = drive  # type: ignore[assignment]
    cls.single_runner = single  # type: ignore[method-assign]
    psycopg.AsyncConnection.connect = connect  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        cls._fetchall = orig_fetchall  # type: ignore[method-assign]
        cls._op = orig_op  # type: ignore[method-assign]
        pg_store._drive = orig_drive
        cls.single_runner = orig_single  # type: ignore[method-assign]
        psycopg.AsyncConnection.connect = orig_connect  # type: ignore[method-assign]


async def _one_tick(db_url: str, engine_url: str, concurrency: int,
                    profile: str | None, budget: float | None) -> Tick:
    from veracity.adapters.config import parse_engine_config
    from veracity.adapters.n8n import N8nEngine
    from veracity.maintenance.reconciler import ReconcilerService
    from veracity.store import open_store

    config = parse_engine_config("n8n", {"base_url": engine_url, "api_key_env": "BENCH_KEY"},
                                 {"BENCH_KEY": API_KEY})
    engine = N8nEngine(config)  # as veracity.adapters.build_engines does
    answered = 0
    inspect = engine.inspect

    async def counted_inspect(external_id: str) -> Any:
        nonlocal answered
        inspection = await inspect(external_id)
        answered += 1
        return inspection

    engine.inspect = counted_inspect  # type: ignore[method-assign]
    store = await open_store(db_url)  # the server's pool size (10)
    try:
        service = ReconcilerService(store, {"n8n": engine}, {FFQN: LIMIT_SECONDS},
                                    concurrency=concurrency)
        profiler = cProfile.Profile() if profile else None
        async with counting_statements() as counts:
            if profiler:
                profiler.enable()
            started, cpu = time.perf_counter(), time.process_time()
            try:
                result = await asyncio.wait_for(service.run_once(), budget)
            except TimeoutError:
                result = None
            seconds = time.perf_counter() - started
            cpu = time.process_time() - cpu
            if profiler and profile:
                profiler.disable()
                profiler.dump_stats(profile)
        figures = (seconds, cpu, counts["db_seconds"], answered, int(counts["statements"]),
                   int(counts["transactions"]), int(counts["connections"]))
        if result is None:
            return Tick(answered, concurrency, *figures, 0, 0, finished=False)
        assert result.ran, "the tick was skipped"
        return Tick(result.examined, concurrency, *figures, len(result.actions),
                    result.engine_errors)
    finally:
        await store.close()
        await engine.aclose()


def one_tick(db_url: str, engine_url: str, concurrency: int, profile: str | None = None,
             budget: float | None = None) -> Tick:
    return asyncio.run(_one_tick(db_url, engine_url, concurrency, profile, budget))


def describe(label: str, t: Tick, n: int, target: float | None) -> str:
    figures = (f"{t.rate:,.0f} engine requests/s, reconciler process CPU "
               f"{t.cpu_seconds:.2f} s, waiting on the database {t.db_seconds:.2f} s, "
               f"{t.statements} database round trips ({t.transactions} transactions, "
               f"{t.connections} new connection(s))")
    head = f"reconciler postgresql  {label}, concurrency {t.concurrency}: "
    if not t.finished:
        projected = n / t.rate if t.rate else float("inf")
        return (f"{head}NOT FINISHED within the {t.seconds:.0f} s budget ({t.engine_requests:,}"
                f" of {n:,} engine answers by then; so far {figures}); at that rate one tick "
                f"takes ~{projected:.0f} s"
                + ("" if target is None else f"; target < {target:g} s: "
                   + ("MISSED" if t.seconds >= target else "unknown (budget below target)")))
    verdict = ""
    if target is not None:
        verdict = f"; target < {target:g} s: " + ("met" if t.seconds < target else "MISSED")
    return (f"{head}{t.seconds:.2f} s per tick, {figures}, {t.engine_requests:,} engine GETs "
            f"(5 ms each), {t.actions:,} executions written, {t.engine_errors} engine errors"
            f"{verdict}")


# --------------------------------------------------------------------------------------------
# Scenarios


TARGETS = {10_000: 5.0, 100_000: 60.0}
"""Issue 5's targets for one tick, in seconds, by number of running executions."""


def common_case(engine_url: str, n: int, concurrencies: list[int], budget: float | None,
                profile: str | None) -> None:
    with scratch_pg_database() as url:
        asyncio.run(migrate(url))
        insert_delegated(url, 1, n)
        for c in concurrencies:
            t = one_tick(url, engine_url, c, f"{profile}.{n}.c{c}" if profile else None,
                         budget)
            if t.finished:
                assert t.executions == n and t.engine_requests == n, t
                assert t.engine_errors == 0 and t.actions == 0, t
            assert count_status(url, "running") == n
            print(describe(f"{n:,} running, all still going (nothing to write)", t, n,
                           TARGETS.get(n)), flush=True)


def finished_case(engine_url: str, going: int, finished: tuple[int, int],
                  concurrencies: list[int], budget: float | None) -> None:
    first_done, last_done = finished
    n_done = last_done - first_done + 1
    n = going + n_done
    for c in concurrencies:
        with scratch_pg_database() as url:
            asyncio.run(migrate(url))
            insert_delegated(url, 1, going)
            insert_delegated(url, first_done, last_done)
            t = one_tick(url, engine_url, c, None, budget)
            if t.finished:
                assert t.executions == n and t.actions == n_done and t.engine_errors == 0, t
                assert count_status(url, "failed_transient") == n_done
                assert count_status(url, "running") == going
            print(describe(f"{n:,} running, {n_done:,} of them finished without a callback "
                           "(failed_transient written)", t, n, TARGETS.get(n)), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--executions", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=100_000,
                        help="the large common case (0: skip it)")
    parser.add_argument("--finished-share", type=float, default=0.10)
    parser.add_argument("--default-concurrency", type=int, default=16)
    parser.add_argument("--high", type=int, nargs="*", default=[64],
                        help="higher concurrency bounds to measure too (default 64: the "
                        "adapter's httpx pool holds at most 64 connections)")
    parser.add_argument("--budget", type=float, default=40.0,
                        help="seconds after which a tick over --executions is cancelled and "
                        "reported as not finished, with its rate so far (0: no budget)")
    parser.add_argument("--large-budget", type=float, default=60.0,
                        help="the same for a tick over --large (0: no budget)")
    parser.add_argument("--profile", metavar="PREFIX",
                        help="write a cProfile of each common-case tick to PREFIX.N.cC")
    parser.add_argument("--serve-fake", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--fake-latency", type=float, default=LATENCY, help=argparse.SUPPRESS)
    parser.add_argument("--fake-going", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--fake-finished", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_fake:
        serve_fake(args.serve_fake, args.fake_latency, args.fake_going, args.fake_finished)
        return
    # the reconciler logs one warning per action: the records are made (their cost is part
    # of the tick), the lines are not printed
    for name in ("veracity", "httpx"):
        logger = logging.getLogger(name)
        logger.addHandler(logging.NullHandler())
        logger.propagate = False

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"reconciler  load average before the run: {load} ({os.cpu_count()} cores; the "
          "fake n8n, PostgreSQL and the reconciler share them)", flush=True)
    concurrencies = [args.default_concurrency, *args.high]
    n = args.executions
    n_done = round(n * args.finished_share)
    going = max(n, args.large)
    with fake_n8n(going, n_done, LATENCY) as engine_url:
        common_case(engine_url, n, concurrencies, args.budget or None, args.profile)
        if n_done:
            finished_case(engine_url, n - n_done, (going + 1, going + n_done),
                          concurrencies, args.budget or None)
        if args.large:
            common_case(engine_url, args.large, concurrencies, args.large_budget or None,
                        args.profile)


if __name__ == "__main__":
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, {platform.platform()}")
    main()
