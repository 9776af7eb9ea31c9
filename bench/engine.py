"""The durable engine on PostgreSQL: three-step workflows per second with one worker
process, and the cost of one checkpointed step in database round trips.

- throughput: N executions of ``bench:steps/run.fn`` (three checkpointed steps each)
  inserted up front; one ``veracity worker`` process; the rate is N over the time from the
  first claim to the last completion, both read from the database's own timestamps.
- round trips: an in-process worker runs a 1-step and an 11-step workflow while every
  statement the store sends is counted (each is one round trip: autocommit statements,
  never client-side transactions on this path); the difference over 10 is the cost of one
  step.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import psycopg

from bench._util import scratch_pg_database
from bench.workers import insert_noops, migrate, wait_done, worker_procs
from veracity import App, Context
from veracity._ids import new_execution_id
from veracity.config import WorkerSettings
from veracity.core.states import Status
from veracity.models import NewExecution
from veracity.store import open_store
from veracity.store.postgres import store as pg_store
from veracity.worker.runner import Worker


def throughput(n: int, concurrency: int) -> float:
    with scratch_pg_database() as url:
        asyncio.run(migrate(url))
        insert_noops(url, n, "bench:steps/run.fn")
        with worker_procs(url, 1, VERACITY_WORKER_CONCURRENCY=str(concurrency)):
            wait_done(url, n, timeout=300)
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM max(updated_at) - "
                "(SELECT min(at) FROM veracity_history WHERE kind = 'running')) "
                "FROM veracity_executions"
            ).fetchone()
            steps = conn.execute(
                "SELECT count(*) FROM veracity_history WHERE kind = 'step_completed'"
            ).fetchone()
            assert row is not None and steps == (3 * n,), steps
            return n / float(row[0])


app = App("bench-roundtrips")


async def _value(i: int) -> int:
    return i


@app.workflow("bench:roundtrips/steps.run")
async def steps(ctx: Context, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.step(_value, i)
    return total


# statements of the worker's own loop (claiming, timers, heartbeats, registration), which
# do not belong to any one execution
LOOP = frozenset({"execution_claim", "execution_wake_due", "lease_renew", "worker_register",
                  "worker_stop"})


async def statements_of_a_run(url: str, n_steps: int) -> list[str]:
    """The names of the statements the store sends for one run of an ``n_steps``-step
    workflow by an in-process worker (the loop's claims, timer sweeps, heartbeats and
    registration left out), in order. Each is one statement on its own connection in
    autocommit: one round trip. A multi-statement transaction (``_op``: BEGIN, its
    statements, COMMIT) is named ``transaction: `` and the store method it is made by."""
    store = await open_store(url)
    names: list[str] = []
    original_fetchall = pg_store.PostgresStore._fetchall
    original_op = pg_store.PostgresStore._op

    async def counting(self: Any, name: str, params: Any, *rows: Any, **kw: Any) -> Any:
        if name not in LOOP:
            names.append(name if kw.get("planning") is None else f"transaction: {name}")
        return await original_fetchall(self, name, params, *rows, **kw)

    async def counting_op(self: Any, factory: Any, **kw: Any) -> Any:
        made_by = str(getattr(factory, "__qualname__", factory))  # the store method's
        if not any(name in made_by.split(".") for name in LOOP):
            names.append(f"transaction: {made_by}")
        return await original_op(self, factory, **kw)

    pg_store.PostgresStore._fetchall = counting  # type: ignore[method-assign]
    pg_store.PostgresStore._op = counting_op  # type: ignore[method-assign]
    try:
        sub = await store.execution_submit(NewExecution(
            ffqn="bench:roundtrips/steps.run", params=[n_steps], deployment_id="bench",
            id=new_execution_id()))
        names.clear()
        # the deployment the execution was submitted to: a worker claims only its own
        worker = Worker(store, app, deployment_id="bench", settings=WorkerSettings(
            concurrency=1, lease_ttl=60, poll_interval=0.05, notifications=False))
        task = asyncio.create_task(worker.run())
        # poll on a connection of its own, so that only the worker's statements are counted
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as poll:
            deadline = asyncio.get_running_loop().time() + 60
            while True:
                if asyncio.get_running_loop().time() > deadline:
                    raise RuntimeError("the worker did not complete the execution in 60 s")
                cur = await poll.execute(
                    "SELECT status FROM veracity_executions WHERE id = %s", [sub.execution.id])
                row = await cur.fetchone()
                if row is not None and row[0] == Status.COMPLETED:
                    break
                await asyncio.sleep(0.01)
        during = worker.claimed_total
        worker.stop()
        await task
        assert during == 1
        return names
    finally:
        pg_store.PostgresStore._fetchall = original_fetchall  # type: ignore[method-assign]
        pg_store.PostgresStore._op = original_op  # type: ignore[method-assign]
        await store.close()


def round_trips_per_step() -> tuple[float, int, int]:
    """(per step, statements for a 1-step run, for an 11-step run): the statements the
    store sent for the execution itself (the loop's claims, timer checks and heartbeats
    left out); every one of them is a single round trip."""
    with scratch_pg_database() as url:
        asyncio.run(migrate(url))
        one = asyncio.run(statements_of_a_run(url, 1))
        eleven = asyncio.run(statements_of_a_run(url, 11))
    if any(n.startswith("transaction") for n in one + eleven):  # BEGIN, ..., COMMIT
        raise RuntimeError(f"a run used a multi-statement transaction: {one}, {eleven}")
    return (len(eleven) - len(one)) / 10, len(one), len(eleven)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--executions", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=128)
    args = parser.parse_args(argv)
    rate = throughput(args.executions, args.concurrency)
    print(f"engine   postgresql  1 worker process, concurrency {args.concurrency}: "
          f"{rate:,.0f} three-step workflows/s ({args.executions})")
    per_step, one, eleven = round_trips_per_step()
    print(f"engine   postgresql  round trips per checkpointed step: {per_step:g} "
          f"(statements for a 1-step run: {one}, for an 11-step run: {eleven})")


if __name__ == "__main__":
    main()
