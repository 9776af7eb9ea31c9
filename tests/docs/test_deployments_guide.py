"""docs/deployments.md promises complete, runnable examples: run them, on both backends --
a worker of the new deployment runs the old deployment's upgrade="auto" execution, leaves
its pinned one stranded (and says so), and runs it once it is adopted."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from veracity import App
from veracity.config import WorkerSettings
from veracity.control import ExecutionService
from veracity.core.states import Status
from veracity.models import Execution
from veracity.store import open_store
from veracity.worker.runner import Worker

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "deployments.md"


def load_guide(tmp_path: Path) -> ModuleType:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) >= 1
    path = tmp_path / "deploy_guide.py"
    path.write_text("\n\n".join(blocks))
    spec = importlib.util.spec_from_file_location("deploy_guide", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["deploy_guide"] = module
    spec.loader.exec_module(module)
    return module


async def wait_status(service: ExecutionService, execution_id: uuid.UUID,
                      statuses: set[Status], timeout: float = 10.0) -> Execution:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        e = await service.get(execution_id)
        if e.status in statuses:
            return e
        assert asyncio.get_running_loop().time() < deadline, (e.status, e.error)
        await asyncio.sleep(0.05)


@pytest.mark.timeout(60)
async def test_the_deployments_guide_runs(tmp_path: Path, database_url: str) -> None:
    guide = load_guide(tmp_path)
    try:
        app: App = guide.app
        store = await open_store(database_url)
        old = ExecutionService(store, workflows=set(app.workflows), deployment_id="d1")
        new = ExecutionService(store, workflows=set(app.workflows), deployment_id="d2")
        settle, _ = await old.submit("deploy:orders/settle.run", ["o-1"])
        notify, _ = await old.submit("deploy:mail/notify.run", ["ada@example.com"])
        worker = Worker(store, app, deployment_id="d2", settings=WorkerSettings(
            lease_ttl=5, heartbeat_interval=0.2, poll_interval=0.05, concurrency=4))
        task = asyncio.create_task(worker.run())
        try:
            sent = await wait_status(new, notify.id, {Status.COMPLETED, Status.FAILED})
            assert sent.result == {"to": "ada@example.com", "sent_by": "d2"}, sent.error
            await asyncio.sleep(0.3)  # several polls of the d2 worker
            stranded = await new.get(settle.id)
            assert stranded.status == Status.PENDING
            assert await new.waiting_reasons([stranded]) == {
                settle.id: "no live worker for deployment d1"}

            adopted = await new.adopt("d1", actor="ops")
            assert adopted.execution_ids == [settle.id]
            sleeping = await wait_status(new, settle.id, {Status.BLOCKED})
            assert sleeping.deployment_id == "d2" and sleeping.wake_at is not None
            kinds: list[Any] = [e.kind for e in await new.history(settle.id)]
            assert kinds[:3] == ["pending", "adopted", "running"], kinds
        finally:
            worker.stop()
            await task
            await store.close()
    finally:
        sys.modules.pop("deploy_guide", None)
