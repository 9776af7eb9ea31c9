"""docs/workflows.md promises complete, runnable examples: run them."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from veracity import App, Context
from veracity.cli.main import event_json, replay_lines
from veracity.config import WorkerSettings
from veracity.control import ExecutionService
from veracity.core.states import Status
from veracity.errors import Conflict
from veracity.store import Store, open_store
from veracity.testing import replay
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
            await check_replays(guide, store, e.id, tmp_path)

            e, _ = await service.submit("guide:reports/build.run", ["2030-01-01"])
            assert (await wait_status(service, e.id, done)).result == "2030-01-01: 3 orders"
            assert app.workflows["guide:reports/build.run"].retry.max_attempts == 3

            e, _ = await service.submit("guide:mail/campaign.run", [["a@x", "b@x"]])
            e = await wait_status(service, e.id, done)
            assert sorted(e.result) == ["sent to a@x", "sent to b@x"]

            e, _ = await service.submit("guide:mail/one.run", ["c@x"])
            assert (await wait_status(service, e.id, done)).result == "sent to c@x"

            # params that do not fit the child's signature: InvalidParams, caught
            e, _ = await service.submit("guide:mail/careful.run", ["d@x"])
            careful = await wait_status(service, e.id, done)
            (documented,) = re.findall(r"^returns `(not sent: .*?)`", GUIDE.read_text(),
                                       flags=re.S | re.M)
            assert careful.result == documented.replace("\n", " ")
            children, _ = await store.execution_children(e.id)
            assert children == []  # nothing was created for the call

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


def changed_process(guide: ModuleType, change: str) -> App:
    """``process`` of the guide with one change, its new steps in module ``guide`` as they
    would be in a changed guide.py."""
    ns: dict[str, Any] = {"__name__": "guide"}
    exec("def bill(order_id, cents):\n    return {}\n"
         "def ship(order_id):\n    return order_id\n", ns)
    app = App("guide-next")

    @app.workflow("guide:orders/process.run")
    async def process(ctx: Context, order_id: str) -> dict[str, Any]:
        first = ns["bill"] if change == "renamed" else guide.charge
        receipt = await ctx.step(first, order_id, 2500)
        if change == "removed":
            return {"receipt": receipt}
        mail = await ctx.step_with(guide.notify, order_id, name="notify-customer")
        if change == "added":
            await ctx.step(ns["ship"], order_id)
        return {"receipt": receipt, "mail": mail}

    return app


async def check_replays(guide: ModuleType, store: Store, execution_id: uuid.UUID,
                        tmp_path: Path) -> None:
    """"Checking a code change against production histories": the outcomes it quotes, and
    its test-suite example over a history saved as ``veracity history --json`` prints it."""
    text = GUIDE.read_text()
    events = await store.history_list(execution_id, limit=10_000)
    outcomes = {
        "same": replay(guide.app, events),
        "renamed": replay(changed_process(guide, "renamed"), events),
        "removed": replay(changed_process(guide, "removed"), events),
        "added": replay(changed_process(guide, "added"), events),
    }
    assert outcomes["same"].consistent and outcomes["same"].finished
    assert not outcomes["renamed"].consistent and not outcomes["removed"].consistent
    assert outcomes["added"].consistent and not outcomes["added"].finished
    for name, result in outcomes.items():
        quoted = " ".join(result.message.split())
        assert quoted in " ".join(text.split()), (name, result.message)
    # the guide's `veracity replay` output, line by line (its id shortened to 01a2...)
    (shown,) = re.findall(r"^```text\n\$ veracity replay 01a2\.\.\.\n(.*?)^```", text,
                          flags=re.S | re.M)
    printed = [line.replace(str(execution_id), "01a2...")
               for line in replay_lines(outcomes["renamed"])]
    assert printed == shown.splitlines()

    saved = tmp_path / "histories"
    saved.mkdir()
    items = [event_json(ev) for ev in events]
    page = {"items": items, "next_cursor": None}
    (saved / f"{execution_id}.json").write_text(json.dumps(page))
    vars(guide)["HISTORIES"] = saved  # where its example reads the saved histories
    guide.test_saved_histories_replay()  # consistent: passes
    step = next(item for item in items if item["kind"] == "step_completed")
    step["data"]["name"] = "guide.bill"  # as if the code had changed since
    (saved / f"{execution_id}.json").write_text(json.dumps(page))
    with pytest.raises(AssertionError) as diverged:
        guide.test_saved_histories_replay()
    assert str(diverged.value).startswith(
        f"{execution_id}.json: nondeterminism at position 0: the history has step "
        "guide.bill, but the workflow now calls step guide.charge")
