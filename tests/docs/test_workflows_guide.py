"""docs/workflows.md promises complete, runnable examples: run them."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from veracity import App
from veracity.config import WorkerSettings
from veracity.control import ExecutionService
from veracity.core.states import Status
from veracity.errors import Conflict
from veracity.store import open_store
from veracity.worker.runner import Worker

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"


def load_guide(tmp_path: Path) -> ModuleType:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) >= 5
    path = tmp_path / "guide.py"
    path.write_text("\n\n".join(blocks))
    spec = importlib.util.spec_from_file_location("guide", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["guide"] = module
    spec.loader.exec_module(module)
    return module


async def wait_status(service: ExecutionService, execution_id, statuses, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        e = await service.get(execution_id)
        if e.status in statuses:
            return e
        assert asyncio.get_running_loop().time() < deadline, (e.status, e.error)
        await asyncio.sleep(0.05)


@pytest.mark.timeout(60)
async def test_the_guide_runs(tmp_path, database_url):
    guide = load_guide(tmp_path)
    try:
        app: App = guide.app
        store = await open_store(database_url)
        service = ExecutionService(store, workflows=set(app.workflows), deployment_id="d-doc")
        worker = Worker(store, app, deployment_id="d-doc", settings=WorkerSettings(
            lease_ttl=5, heartbeat_interval=0.2, poll_interval=0.05, concurrency=8))
        task = asyncio.create_task(worker.run())
        try:
            done = {Status.COMPLETED, Status.FAILED}
            e, _ = await service.submit("guide:orders/process.run", ["o-1"])
            e = await wait_status(service, e.id, done)
            assert e.status == Status.COMPLETED, e.error
            assert e.result == {"receipt": {"order_id": "o-1", "charged": 2500},
                                "mail": "mailed o-1"}

            e, _ = await service.submit("guide:mail/campaign.run", [["a@x", "b@x"]])
            e = await wait_status(service, e.id, done)
            assert sorted(e.result) == ["sent to a@x", "sent to b@x"]

            e, _ = await service.submit("guide:mail/one.run", ["c@x"])
            assert (await wait_status(service, e.id, done)).result == "sent to c@x"

            e, _ = await service.submit("guide:orders/approve.run", ["o-2"])
            await wait_status(service, e.id, {Status.BLOCKED})
            await service.send(e.id, "approval", {"by": "ada"})
            assert (await wait_status(service, e.id, done)).result == "o-2: ada"

            e, _ = await service.submit("guide:reminders/remind.run", ["bob"])
            blocked = await wait_status(service, e.id, {Status.BLOCKED})
            assert blocked.wake_at is not None

            e, _ = await service.submit("guide:monitor/watch.run-cancellable", ["sku-1"])
            await wait_status(service, e.id, {Status.BLOCKED})
            cancelled, _ = await service.cancel(e.id)
            assert cancelled.status == Status.CANCELLED

            e, _ = await service.submit("guide:fleet/reconcile.run", [["k1", "k2"]])
            started = (await wait_status(service, e.id, done)).result
            assert sorted(started) == ["k1", "k2"]
            for key, child in started.items():
                assert (await wait_status(service, child, done)).result == f"serving {key}"

            e, _ = await service.submit("guide:audit/stamp.run", ["x"])
            stamped = (await wait_status(service, e.id, done)).result
            assert stamped["execution_id"] == str(e.id)
            assert stamped["deployment_id"] == "d-doc" and stamped["at"]

            e, _ = await service.submit("guide:billing/settle.run", ["acc-1"])
            await wait_status(service, e.id, {Status.BLOCKED})
            paused, _ = await service.pause(e.id)
            assert paused.status == Status.PAUSED
            unpaused, _ = await service.unpause(e.id)
            assert unpaused.status == Status.BLOCKED and unpaused.wake_at is not None
            with pytest.raises(Conflict) as refused:
                await service.cancel(e.id)  # not -cancellable: pausing is the way
            assert refused.value.code == "not_cancellable"
        finally:
            worker.stop()
            await task
            await store.close()
    finally:
        sys.modules.pop("guide", None)
