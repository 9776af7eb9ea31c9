"""A worker killed with -9 shows as not live once its heartbeat is late by more than two
heartbeat intervals, long before its leases expire (docs/workers.md): in ``GET
/v1/workers``, ``veracity workers``, the deployments' live counts and the waiting reason of
the execution it held. A real ``veracity worker`` process (tests.worker._procs) beating
every 0.3 s with a 60 s lease, on both backends."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from datetime import timedelta
from typing import Any

import httpx
import pytest

from tests._helpers import store_fixture
from tests.worker._procs import DEPLOYMENT, Processes, veracity_bin, wait_until, worker_env
from tests.workflows import app as test_app
from veracity.api import create_api
from veracity.control import ExecutionService
from veracity.core.states import Status
from veracity.models import NewExecution
from veracity.store import Store

TTL = 60.0
BEAT = 0.3
ENV = {"VERACITY_LEASE_TTL": str(TTL), "VERACITY_HEARTBEAT_INTERVAL": str(BEAT)}

store = store_fixture(pool_size=4)


async def cli_workers(database_url: str) -> list[dict[str, Any]]:
    done = await asyncio.to_thread(
        subprocess.run, [veracity_bin(), "workers", "--json"],
        env=worker_env(database_url, ENV), capture_output=True, text=True, timeout=30,
        check=False)
    assert done.returncode == 0, done.stderr
    items: list[dict[str, Any]] = json.loads(done.stdout)["items"]
    return items


@pytest.mark.timeout(60)
async def test_a_worker_killed_with_9_is_not_live_after_two_missed_beats(
    database_url: str, store: Store, procs: Processes, tmp_path: Any
) -> None:
    service = ExecutionService(store, workflows=set(test_app.workflows),
                               deployment_id=DEPLOYMENT, live_within=timedelta(seconds=TTL))
    transport = httpx.ASGITransport(app=create_api(service))
    held = NewExecution(ffqn="test:steps/run.fn", params=[str(tmp_path / "marks"), 1, 30.0],
                        deployment_id=DEPLOYMENT, id=uuid.uuid4())
    await store.execution_submit(held)
    a = procs.worker(database_url, "A", env=ENV)

    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        async def workers() -> dict[str, dict[str, Any]]:
            response = await client.get("/v1/workers")
            assert response.status_code == 200, response.text
            return {w["id"]: w for w in response.json()["items"]}

        async def live_deployment() -> int:
            items = (await client.get("/v1/deployments")).json()["items"]
            return int(next(d["live_workers"] for d in items if d["id"] == DEPLOYMENT))

        async def reason() -> str:
            response = await client.get(f"/v1/executions/{held.id}")
            assert response.status_code == 200, response.text
            text: str = response.json()["waiting_reason"]
            return text

        async def running() -> str | None:
            e = await store.execution_get(held.id)
            assert a.alive, a.describe()
            return e.lease_owner if e is not None and e.status == Status.RUNNING else None

        claimed = await wait_until(running, 15, what="A to claim", describe=a.describe)
        assert claimed is not None
        owner: str = claimed
        assert (await workers())[owner]["live"] is True
        assert (await workers())[owner]["heartbeat_interval"] == BEAT
        assert await live_deployment() == 1
        assert (await reason()).startswith(f"held by worker {owner} whose last heartbeat was")
        assert [w["live"] for w in await cli_workers(database_url) if w["id"] == owner] == [True]

        a.kill9()
        killed_at = time.monotonic()

        async def dead() -> bool:
            return (await workers())[owner]["live"] is False

        await wait_until(dead, 10, what="A to show as not live", describe=a.describe)
        # about three intervals (0.9 s) after its last beat, not the lease's 60 s
        assert time.monotonic() - killed_at < 10
        assert await live_deployment() == 0
        assert (await reason()).startswith(
            f"held by worker {owner}, not live (its last heartbeat was ")
        assert [w["live"] for w in await cli_workers(database_url) if w["id"] == owner] == [
            False]
        e = await store.execution_get(held.id)
        assert e is not None and e.status == Status.RUNNING and e.lease_owner == owner
        assert e.lease_expires_at is not None and e.lease_expires_at > await store.db_now()
