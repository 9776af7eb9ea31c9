"""A Veracity API served on a free loopback port with API tokens required, and a worker of
the current deployment whose ``control_plane`` binding carries a reconciler's token: the
generation reconciler running for real, in the test's process (fast), on either backend.
Every request the API receives is recorded, and ``gate`` may answer one in its place."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from tests._helpers import wait_status
from tests._pg import free_port
from tests.durable._support import SETTINGS, running
from veracity import App
from veracity.api import create_api
from veracity.bindings import resolve_http
from veracity.config import load_settings
from veracity.control import ExecutionService, TokenService
from veracity.core.states import Status
from veracity.models import Execution, ExecutionFilter
from veracity.store import Store
from veracity.worker.runner import Worker

SCOPES = ["executions:read", "executions:cancel", "executions:pause"]
CURRENT, OLD = "d2", "d1"

Gate = Callable[[dict[str, Any]], Awaitable[tuple[int, dict[str, Any]] | None]]


@dataclass
class Running:
    store: Store
    current: ExecutionService
    """Submits as the current deployment's server does."""
    old: ExecutionService
    """Submits to the older deployment (no worker runs it)."""
    seen: list[tuple[str, str]]
    gate: list[Gate]
    url: str
    reconciler: str
    prefix: str

    async def reconcile(self) -> Execution:
        """Start a run of the reconciler (as its cron entry would); once it has ended."""
        run, _ = await self.current.submit(self.reconciler, [])
        return await wait_status(self.store, run.id, Status.COMPLETED, Status.FAILED,
                                 timeout=20)

    async def managed(self, *statuses: Status) -> list[Execution]:
        """The executions whose name starts with the prefix (in ``statuses``, or all)."""
        found = await self.store.execution_list(
            ExecutionFilter(ffqn_prefix=self.prefix, statuses=tuple(statuses)), limit=1000)
        return list(found)


@asynccontextmanager
async def served(store: Store, tmp_path: Path, app: App, *, reconciler: str, prefix: str,
                 scopes: list[str] = SCOPES) -> AsyncIterator[Running]:
    port = free_port()
    config = tmp_path / "veracity.toml"
    config.write_text(f'''
[[http]]
name = "control_plane"
origin = "http://127.0.0.1:{port}"
methods = ["GET", "PUT"]
headers = {{ Authorization = "Bearer ${{secret:control_token}}" }}
''')
    token = (await TokenService(store).create("reconciler", scopes)).token
    bindings = resolve_http(load_settings(config, env={}),
                            {"VERACITY_SECRET_CONTROL_TOKEN": token})
    current = ExecutionService(store, workflows=set(app.workflows), deployment_id=CURRENT)
    old = ExecutionService(store, workflows=set(app.workflows), deployment_id=OLD)
    api = create_api(current, auth_required=True)
    seen: list[tuple[str, str]] = []
    gate: list[Gate] = []

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen.append((scope["method"], scope["path"]))
            for check in gate:
                answer = await check(scope)
                if answer is not None:
                    status, body = answer
                    await send({"type": "http.response.start", "status": status,
                                "headers": [(b"content-type", b"application/json")]})
                    await send({"type": "http.response.body",
                                "body": httpx.Response(status, json=body).content})
                    return
        await api(scope, receive, send)

    server = uvicorn.Server(uvicorn.Config(recording, host="127.0.0.1", port=port,
                                           log_config=None, lifespan="off"))
    serving = asyncio.create_task(server.serve())
    worker = Worker(store, app, settings=SETTINGS, deployment_id=CURRENT, http=bindings)
    try:
        while not server.started:
            assert not serving.done(), "the API did not start"
            await asyncio.sleep(0.02)
        async with running(worker):
            yield Running(store, current, old, seen, gate, f"http://127.0.0.1:{port}",
                          reconciler, prefix)
    finally:
        server.should_exit = True
        await serving
