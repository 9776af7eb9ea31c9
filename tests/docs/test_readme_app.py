"""README.md's "Writing an app" example, run as an app: a worker runs `process` through its
step, its hour of durable sleep (a manual clock is moved on by an hour, as the database's
would be), its wait for the "approval" message (sent as the API sends one) and its child
`shop:mail/send.run`, on both backends."""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.docs._modules import run_as_module
from veracity import App
from veracity.clock import ManualClock
from veracity.config import WorkerSettings
from veracity.control import ExecutionService
from veracity.core.states import Status
from veracity.models import Execution
from veracity.store import open_store
from veracity.worker.runner import Worker

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_app(tmp_path: Path) -> App:
    [block] = [b for b in re.findall(r"^```python\n(.*?)^```", README.read_text(),
                                     flags=re.S | re.M) if "@app.workflow" in b]
    app: App = run_as_module("readme_app", block, tmp_path).app
    return app


async def until(service: ExecutionService, execution_id: uuid.UUID,
                done: Any) -> Execution:
    deadline = asyncio.get_running_loop().time() + 15
    while True:
        execution = await service.get(execution_id)
        if done(execution):
            return execution
        assert asyncio.get_running_loop().time() < deadline, execution
        await asyncio.sleep(0.02)


@pytest.mark.timeout(60)
async def test_the_readme_app_runs(tmp_path: Path, database_url: str,
                                   clock: ManualClock) -> None:
    app = readme_app(tmp_path)
    assert sorted(app.workflows) == ["shop:mail/send.run", "shop:orders/process.run"]
    store = await open_store(database_url, clock=clock)
    service = ExecutionService(store, workflows=set(app.workflows), deployment_id="d-readme")
    worker = Worker(store, app, deployment_id="d-readme", settings=WorkerSettings(
        lease_ttl=5, heartbeat_interval=0.2, poll_interval=0.05, concurrency=8))
    task = asyncio.create_task(worker.run())
    try:
        submitted, created = await service.submit("shop:orders/process.run", ["order-1"])
        assert created
        asleep = await until(service, submitted.id, lambda e: e.wake_at is not None)
        assert asleep.status == Status.BLOCKED
        assert asleep.wake_at is not None
        assert timedelta(hours=1) <= asleep.wake_at - clock.now() < timedelta(hours=1, seconds=1)
        clock.advance(timedelta(hours=1, seconds=1))
        # awake, the workflow waits for its message: blocked again, without a timer
        waiting = await until(service, submitted.id,
                              lambda e: e.status == Status.BLOCKED and e.wake_at is None)
        assert waiting.result is None
        await service.send(submitted.id, "approval", {"by": "ada"})
        ended = await until(service, submitted.id, lambda e: e.status.is_terminal)
        assert ended.status == Status.COMPLETED, ended.error
        assert ended.result == {"receipt": {"order_id": "order-1", "charged": 2500},
                                "approval": {"by": "ada"}, "mail": "mailed order-1"}
        children, _ = await store.execution_children(submitted.id)
        assert [(c.ffqn, c.params, c.status) for c in children] == [
            ("shop:mail/send.run", ["order-1"], Status.COMPLETED)]
    finally:
        worker.stop()
        await task
        await store.close()
