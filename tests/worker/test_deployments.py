"""Workers and deployments (docs/deployments.md), in-process workers on a real store, both
backends: a worker claims only its own deployment's executions, except those of workflows
registered with ``upgrade="auto"``, which it takes from every deployment onto its own; a
worker records its deployment when it starts and keeps it seen with its heartbeat."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from tests._helpers import store_fixture, until
from veracity import App, Context
from veracity._ids import new_execution_id
from veracity.config import WorkerSettings
from veracity.control import ExecutionService
from veracity.core.states import Status
from veracity.models import Execution, NewExecution
from veracity.store import Store
from veracity.worker.runner import Worker

SETTINGS = WorkerSettings(lease_ttl=5, heartbeat_interval=0.2, poll_interval=0.05,
                          concurrency=4, shutdown_grace=1)
PINNED = "wd:orders/pinned.run"
AUTO = "wd:orders/auto.run"
CHILD = "wd:orders/child.run"

app = App("deployment-tests")


@app.workflow(PINNED)
async def pinned(ctx: Context, x: str) -> dict[str, str]:
    return {"ran": x, "deployment_id": ctx.deployment_id}


@app.workflow(AUTO, upgrade="auto")
async def auto(ctx: Context, x: str) -> dict[str, Any]:
    child = await ctx.call(CHILD, x)
    return {"ran": x, "deployment_id": ctx.deployment_id, "child": child}


@app.workflow(CHILD)
async def child(ctx: Context, x: str) -> str:
    return ctx.deployment_id


store = store_fixture(pool_size=4)


async def submit(store: Store, ffqn: str, deployment_id: str, x: str) -> Execution:
    new = NewExecution(ffqn=ffqn, params=[x], deployment_id=deployment_id,
                       id=new_execution_id())
    return (await store.execution_submit(new)).execution


async def ended(store: Store, execution_id: uuid.UUID) -> Execution:
    async def check() -> Execution | None:
        e = await store.execution_get(execution_id)
        return e if e is not None and e.status.is_terminal else None

    done: Execution = await until(check, what=f"{execution_id} to end")
    return done


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, timeout=10)


async def test_a_worker_claims_its_deployments_and_every_deployments_auto_workflows(
    store: Store
) -> None:
    old_pinned = await submit(store, PINNED, "d1", "a")
    old_auto = await submit(store, AUTO, "d1", "b")
    new_pinned = await submit(store, PINNED, "d2", "c")
    service = ExecutionService(store, workflows=set(app.workflows), deployment_id="d2",
                               live_within=timedelta(seconds=5))

    async with running(Worker(store, app, settings=SETTINGS, deployment_id="d2")):
        done = await ended(store, new_pinned.id)
        assert (done.status, done.result) == (Status.COMPLETED, {"ran": "c",
                                                                  "deployment_id": "d2"})
        upgraded = await ended(store, old_auto.id)
        # claimed from d1, it now belongs to d2, and so does the child it started
        assert upgraded.status == Status.COMPLETED, upgraded.error
        assert upgraded.deployment_id == "d2"
        assert upgraded.result == {"ran": "b", "deployment_id": "d2", "child": "d2"}
        runs = [e for e in await store.history_list(old_auto.id) if e.kind == "running"]
        assert [e.data["deployment_id"] for e in runs] == ["d2"] * len(runs)

        await asyncio.sleep(0.5)  # some ten more polls of w2: it leaves d1's pinned one
        left = await store.execution_get(old_pinned.id)
        assert left is not None and left.status == Status.PENDING and left.lease_owner is None
        assert [e.kind for e in await store.history_list(old_pinned.id)] == ["pending"]
        waiting = await service.waiting_reasons([left])
        assert waiting == {old_pinned.id: "no live worker for deployment d1"}
        (d1,) = [d for d in await service.deployments() if d.summary.id == "d1"]
        assert (d1.summary.stranded, d1.summary.live_workers) == (1, 0)

    # a worker of d1 runs it
    async with running(Worker(store, app, settings=SETTINGS, deployment_id="d1")):
        done = await ended(store, old_pinned.id)
        assert (done.status, done.result) == (Status.COMPLETED, {"ran": "a",
                                                                  "deployment_id": "d1"})


async def test_a_worker_records_its_deployment_and_keeps_it_seen(store: Store) -> None:
    worker = Worker(store, app, settings=SETTINGS, deployment_id="d-seen")
    assert worker.upgrade_ffqns == [AUTO]
    async with running(worker):
        async def registered() -> Any:
            return [w for w in await store.worker_list() if w.id == worker.id]

        (rec,) = await until(registered, what="its registration")
        assert (rec.deployment_id, rec.upgrade_ffqns) == ("d-seen", [AUTO])
        first = await store.deployment_get("d-seen")
        assert first is not None and first.first_seen <= rec.started_at

        async def seen_again() -> Any:
            now = await store.deployment_get("d-seen")
            return now if now is not None and now.last_seen > first.last_seen else None

        later = await until(seen_again, what="a heartbeat to see the deployment again")
        assert later.first_seen == first.first_seen
