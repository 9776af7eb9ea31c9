"""Helpers shared by the durable-engine tests: a worker run in-process as an asyncio task,
the API in-process over httpx's ASGI transport, and short poll loops."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx

from veracity.app import App
from veracity.config import WorkerSettings
from veracity.core.states import Status
from veracity.models import JSON, Execution, HistoryEvent, NewExecution
from veracity.store import Store
from veracity.worker.runner import Worker

SETTINGS = WorkerSettings(
    lease_ttl=3, heartbeat_interval=0.2, poll_interval=0.05, concurrency=8, shutdown_grace=1
)
DEPLOYMENT = "d-engine-tests"
MAX_PAYLOAD = 2048


async def until(
    check: Callable[[], Awaitable[Any]], *, timeout: float = 10.0, what: str = "condition"
) -> Any:
    """Poll ``check`` until it returns something truthy; return that."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = await check()
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def get(store: Store, execution_id: uuid.UUID) -> Execution:
    found = await store.execution_get(execution_id)
    assert found is not None, f"execution {execution_id} does not exist"
    return found


async def wait_status(
    store: Store, execution_id: uuid.UUID, *statuses: Status, timeout: float = 10.0
) -> Execution:
    async def check() -> Execution | None:
        ex = await store.execution_get(execution_id)
        return ex if ex is not None and ex.status in statuses else None

    got: Execution = await until(
        check, timeout=timeout, what=f"{execution_id} to be {'/'.join(statuses)}")
    return got


async def history(store: Store, execution_id: uuid.UUID) -> list[HistoryEvent]:
    return await store.history_list(execution_id, limit=10_000)


async def kinds(store: Store, execution_id: uuid.UUID) -> list[str]:
    return [e.kind for e in await history(store, execution_id)]


async def events(store: Store, execution_id: uuid.UUID, kind: str) -> list[HistoryEvent]:
    return [e for e in await history(store, execution_id) if e.kind == kind]


async def wait_kind(
    store: Store, execution_id: uuid.UUID, kind: str, *, count: int = 1, timeout: float = 10.0
) -> list[HistoryEvent]:
    """Wait until the history holds at least ``count`` events of ``kind``."""

    async def check() -> list[HistoryEvent] | None:
        found = await events(store, execution_id, kind)
        return found if len(found) >= count else None

    got: list[HistoryEvent] = await until(
        check, timeout=timeout, what=f"{count} {kind} event(s) of {execution_id}")
    return got


async def submit(store: Store, ffqn: str, *params: JSON, paused: bool = False) -> Execution:
    new = NewExecution(ffqn=ffqn, params=list(params), deployment_id=DEPLOYMENT,
                       id=uuid.uuid4(), paused=paused)
    return (await store.execution_submit(new)).execution


def make_worker(store: Store, app: App, settings: WorkerSettings = SETTINGS) -> Worker:
    return Worker(store, app, settings=settings, deployment_id=DEPLOYMENT)


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    """Run ``worker`` as a task for the duration of the block; stop and drain it after."""
    task = asyncio.create_task(worker.run(), name=f"test-worker-{worker.id}")
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, timeout=10)


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    return error
