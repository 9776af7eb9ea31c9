"""A worker whose process is gone is recovered at once, not when its leases expire
(docs/workers.md, "A worker whose process is gone"): real ``veracity worker`` processes on
one host, with leases of 60 s, on both backends. A worker killed with -9 has its executions
taken by a live worker's lease recovery within seconds; a frozen worker (SIGSTOP) still
exists, keeps its leases and finishes its own work once resumed."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests._helpers import history, store_fixture
from tests.worker._procs import Processes, WorkerProcess, wait_until
from veracity._ids import new_execution_id
from veracity.core.states import Status
from veracity.models import NewExecution
from veracity.store import Store

STEPS = "test:steps/run.fn"
LONG_LEASE = {"VERACITY_LEASE_TTL": "60", "VERACITY_RECOVERY_INTERVAL": "0.3"}
"""Leases that outlive the test's deadlines: only the gone-process path can recover."""

store = store_fixture(pool_size=4)


async def submit(store: Store, params: list[Any], n: int) -> list[uuid.UUID]:
    ids = []
    for _ in range(n):
        done = await store.execution_submit(NewExecution(
            ffqn=STEPS, params=params, deployment_id="d-test", id=new_execution_id()))
        ids.append(done.execution.id)
    return ids


def marks_of(marks: Path) -> Counter[str]:
    return Counter(marks.read_text().splitlines()) if marks.exists() else Counter()


async def statuses(store: Store, ids: list[uuid.UUID]) -> list[Status]:
    out = []
    for ident in ids:
        e = await store.execution_get(ident)
        assert e is not None
        out.append(e.status)
    return out


async def busy_worker(database_url: str, store: Store, procs: Processes, marks: Path,
                      steps: int, n: int) -> tuple[WorkerProcess, str, list[uuid.UUID]]:
    """Worker A, with long leases, in the middle of ``n`` executions of ``steps`` steps."""
    a = procs.worker(database_url, "A", env=LONG_LEASE)
    a_id = await a.registered()
    ids = await submit(store, [str(marks), steps, 0.3], n=n)
    await wait_until(lambda: sum(marks_of(marks).values()) >= n, 15,
                     what="A to run some steps", describe=a.describe)
    return a, a_id, ids


@pytest.mark.timeout(60)
async def test_a_worker_killed_with_9_is_recovered_long_before_its_leases_expire(
    database_url: str, store: Store, procs: Processes, tmp_path: Path
) -> None:
    a, a_id, ids = await busy_worker(database_url, store, procs, tmp_path / "marks.txt",
                                     steps=4, n=3)
    a.kill9()
    b = procs.worker(database_url, "B", env=LONG_LEASE)
    await b.registered()
    # 60 s leases: within 30 s only B's recovery, seeing A's pid gone, can have done this
    await wait_until(lambda: _all(store, ids, Status.COMPLETED), 30,
                     what="every execution completed by B", describe=procs.describe)
    for ident in ids:
        events = await history(store, ident)
        expired = [ev for ev in events
                   if ev.data and ev.data.get("reason") == "lease expired"]
        assert [ev.data["owner"] for ev in expired if ev.data] in ([], [a_id]), events
        assert [ev.kind for ev in events].count("completed") == 1
    assert any(r.get("message", "").startswith(f"worker {a_id} is gone")
               for r in b.log_records()), b.describe()
    gone = [w for w in await store.worker_list() if w.id == a_id]
    assert gone and gone[0].stopped_at is not None  # the registry says A stopped
    b.terminate()
    assert await b.wait(10) == 0, b.describe()


@pytest.mark.timeout(60)
async def test_a_frozen_worker_is_not_gone_and_keeps_its_executions(
    database_url: str, store: Store, procs: Processes, tmp_path: Path
) -> None:
    a, a_id, ids = await busy_worker(database_url, store, procs, tmp_path / "marks.txt",
                                     steps=3, n=2)
    a.signal(signal.SIGSTOP)
    b = procs.worker(database_url, "B", env=LONG_LEASE)
    await b.registered()
    # B's recovery ticks every 0.3 s from its start (the test above shows one tick is
    # enough to take a gone worker's executions); give it several, then look
    await asyncio.sleep(2.0)
    held = [await store.execution_get(i) for i in ids]
    assert all(e is not None and e.status is Status.RUNNING and e.lease_owner == a_id
               for e in held), held
    assert not any(r.get("message", "").startswith(f"worker {a_id} is gone")
                   for r in b.log_records())
    a.signal(signal.SIGCONT)
    await wait_until(lambda: _all(store, ids, Status.COMPLETED), 30,
                     what="A to finish its own executions", describe=procs.describe)
    for ident in ids:
        events = await history(store, ident)
        assert not [ev for ev in events if ev.data and ev.data.get("reason") == "lease expired"]
    for w in (a, b):
        w.terminate()
        assert await w.wait(10) == 0, w.describe()


async def _all(store: Store, ids: list[uuid.UUID], status: Status) -> bool:
    return all(s is status for s in await statuses(store, ids))
