"""Helpers shared by the durable-engine tests: a worker run in-process as an asyncio task,
the API in-process over httpx's ASGI transport, and short poll loops (those every folder
uses come from tests/_helpers.py and are re-exported here)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from tests._helpers import events as events
from tests._helpers import get as get
from tests._helpers import history as history
from tests._helpers import kinds as kinds
from tests._helpers import until as until
from tests._helpers import wait_status as wait_status
from veracity.app import App
from veracity.config import WorkerSettings
from veracity.models import JSON, Execution, HistoryEvent, NewExecution
from veracity.store import Store
from veracity.worker.runner import Worker

SETTINGS = WorkerSettings(
    lease_ttl=3, heartbeat_interval=0.2, poll_interval=0.05, concurrency=8, shutdown_grace=1
)
DEPLOYMENT = "d-engine-tests"
MAX_PAYLOAD = 2048


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
