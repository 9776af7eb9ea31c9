"""The deployment registry fed by real processes (docs/deployments.md): ``veracity worker``
and ``veracity server`` record their deployment when they start (first seen) and keep it
seen while they run (last seen); a server without ``deployment_id`` runs the digest of its
app's code. Both backends."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_server import TEST_APP, app_env, free_port, server_process
from tests.worker._procs import Processes, wait_until
from veracity.app import load_app
from veracity.models import DeploymentRecord
from veracity.store import Store, open_store


def when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def record(database_url: str, deployment_id: str) -> DeploymentRecord | None:
    store: Store = await open_store(database_url)
    try:
        return await store.deployment_get(deployment_id)
    finally:
        await store.close()


@pytest.mark.timeout(60)
async def test_a_worker_process_records_its_deployment(
    database_url: str, procs: Processes
) -> None:
    w = procs.worker(database_url, "W", env={"VERACITY_DEPLOYMENT_ID": "d-proc"})

    async def recorded() -> DeploymentRecord | None:
        return await record(database_url, "d-proc")

    first = await wait_until(recorded, 15, what="the worker's deployment", describe=w.describe)
    assert first is not None
    assert first.first_seen == first.last_seen  # as it registered

    async def seen_again() -> DeploymentRecord | None:
        now = await recorded()
        return now if now is not None and now.last_seen > first.last_seen else None

    later = await wait_until(seen_again, 10, what="a heartbeat", describe=w.describe)
    assert later is not None
    assert later.first_seen == first.first_seen
    w.terminate()
    assert await w.wait(10) == 0, w.describe()
    stopped = await recorded()
    assert stopped is not None and stopped.first_seen == first.first_seen


@pytest.mark.timeout(60)
async def test_a_server_process_records_its_deployment_by_default_its_code_digest(
    database_url: str, tmp_path: Path
) -> None:
    digest = load_app(TEST_APP).code_digest()
    port = free_port()
    env = app_env(database_url, port, VERACITY_HEARTBEAT_INTERVAL="0.3")
    del env["VERACITY_DEPLOYMENT_ID"]  # the default: the digest of the app's code
    with server_process(tmp_path, env, port, ["--no-worker"]) as server:
        await asyncio.to_thread(server.wait_healthy)
        async with httpx.AsyncClient(base_url=server.url, timeout=5.0) as client:
            async def listed() -> list[dict[str, Any]]:
                items: list[dict[str, Any]] = (
                    await client.get("/v1/deployments")).json()["items"]
                return items

            (mine,) = await listed()
            assert (mine["id"], mine["current"], mine["live_workers"]) == (digest, True, 0)
            first_seen = mine["first_seen"]
            assert first_seen is not None

            async def seen_again() -> dict[str, Any] | None:
                (now,) = await listed()
                return now if when(now["last_seen"]) > when(mine["last_seen"]) else None

            later = await wait_until(seen_again, 10, what="the server to be seen again",
                                     describe=server.stderr)
            assert later["first_seen"] == first_seen
    stored = await record(database_url, digest)
    assert stored is not None and stored.first_seen == when(first_seen)
