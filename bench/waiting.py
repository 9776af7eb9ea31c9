"""What the waiting reasons cost a list page (docs/states.md#why-an-execution-waits), on
SQLite and on PostgreSQL.

One process, over a real store: ``--executions`` top-level executions, a quarter each
pending, submitted paused, asleep (blocked on a timer, its ``blocked`` event written by
the worker's own statement) and waiting for two children of a join set (the children
pending), plus ``--workers`` registered workers. Then ``--runs`` times each, alternating:
the store's list query alone for a page of ``--limit`` (``execution_list``), and the
control plane's whole page (``ExecutionService.page``: the same query plus the waiting
reason of every item, read in three more statements). Printed: the medians and the
difference, and how many store calls the reasons took for the page.
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
from typing import Any

from bench._util import scratch_pg_database
from veracity.control import ExecutionService
from veracity.core.waiting import children_reason, sleep_reason
from veracity.models import Claim, ExecutionFilter, NewExecution, WorkerInfo
from veracity.store import Store, open_store

FFQN = "bench:waiting/run.fn"
DEPLOYMENT = "bench"
TTL = timedelta(minutes=10)


class Counting:
    """The store, counting the calls made to it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        self.calls += 1
        return getattr(self.store, name)


async def _fill(store: Store, n: int, workers: int) -> None:
    for i in range(workers):
        await store.worker_register(WorkerInfo(
            id=f"w{i}", host="bench", pid=i, deployment_id=DEPLOYMENT, ffqns=[FFQN],
            concurrency=16, heartbeat_interval=30.0))
    quarter = n // 4
    for i in range(n):
        new = NewExecution(ffqn=FFQN, params=[i], deployment_id=DEPLOYMENT, id=uuid.uuid4(),
                           paused=quarter <= i < 2 * quarter)
        await store.execution_submit(new)
        if i < 2 * quarter:
            continue
        (claimed,) = await store.execution_claim("w0", [FFQN], limit=1, lease_ttl=TTL)
        claim = Claim(claimed.id, "w0", claimed.lease_epoch)
        if i < 3 * quarter:
            await store.execution_block_if_owned(
                claim, wake_at=claimed.updated_at + timedelta(hours=1), seen_signal=0,
                events=[], reason=sleep_reason())
            continue
        kids = [NewExecution(ffqn="bench:waiting/child.fn", params=[k], deployment_id=DEPLOYMENT,
                             id=uuid.uuid4(), parent_id=claimed.id, join_set="js0")
                for k in range(2)]
        await store.execution_spawn_if_owned(claim, kids, [])
        seen = (await store.execution_get(claimed.id))
        assert seen is not None
        await store.execution_block_if_owned(claim, wake_at=None, seen_signal=seen.signal_seq,
                                             events=[], reason=children_reason("js0"))


async def measure(database_url: str, executions: int, workers: int, limit: int,
                  runs: int) -> str:
    store = await open_store(database_url)
    try:
        await store.migrate()
        await _fill(store, executions, workers)
        counting = Counting(store)
        service = ExecutionService(counting, workflows={FFQN},
                                   deployment_id=DEPLOYMENT)
        alone: list[float] = []
        whole: list[float] = []
        calls = 0
        reasons = 0
        for _ in range(runs + 3):
            start = time.perf_counter()
            await store.execution_list(ExecutionFilter(), limit=limit + 1)
            alone.append(time.perf_counter() - start)
            counting.calls = 0
            start = time.perf_counter()
            page = await service.page(ExecutionFilter(), limit=limit)
            whole.append(time.perf_counter() - start)
            calls, reasons = counting.calls - 1, len(page.waiting)  # less the list itself
        alone, whole = alone[3:], whole[3:]
    finally:
        await store.close()
    a, w = statistics.median(alone) * 1000, statistics.median(whole) * 1000
    return (f"page of {limit} ({reasons} waiting reasons, {executions} executions and their "
            f"children, {workers} workers): list alone median {a:.1f} ms, with the reasons "
            f"{w:.1f} ms (+{w - a:.1f} ms, {calls} store calls for the reasons; {runs} runs)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--executions", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        line = asyncio.run(measure(f"sqlite:///{Path(tmp) / 'bench.db'}", args.executions,
                                   args.workers, args.limit, args.runs))
        print(f"waiting sqlite      {line}")
    with scratch_pg_database() as url:
        line = asyncio.run(measure(url, args.executions, args.workers, args.limit, args.runs))
        print(f"waiting postgresql  {line}")


if __name__ == "__main__":
    main()
