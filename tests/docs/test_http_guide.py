"""docs/http.md promises complete, runnable examples and exact messages: run them.

The guide's configuration and secrets file are loaded as written (the control plane's port
and the secrets file's path are the test's own); its step cancels an execution through a
real Veracity API served on loopback, which records the headers it was sent; its refusal
messages are produced by the worker's client and compared word for word.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import uvicorn

from tests._pg import free_port
from tests.durable._support import SETTINGS, running, wait_status
from veracity import Context, StepFailed
from veracity.api import create_api
from veracity.bindings import resolve_http
from veracity.config import load_settings
from veracity.control import ExecutionService, TokenService
from veracity.core.states import Status
from veracity.core.tokens import Scope
from veracity.errors import ConfigError
from veracity.store import Store, open_store
from veracity.worker.runner import Worker

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "http.md"
DOC_ORIGIN = "127.0.0.1:8000"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", GUIDE.read_text(), flags=re.S)


def load_guide(tmp_path: Path, origin: str) -> ModuleType:
    [code] = blocks("python")
    path = tmp_path / "http_guide.py"
    path.write_text(code.replace(DOC_ORIGIN, origin))
    spec = importlib.util.spec_from_file_location("http_guide", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["http_guide"] = module
    spec.loader.exec_module(module)
    return module


def documented_refusals() -> list[str]:
    text = " ".join(GUIDE.read_text().split())  # the guide wraps them across lines
    found = re.findall(r"`(ctx\.http refused [^`]*)`", text)
    assert len(found) == 2, found
    return found


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await open_store(database_url, pool_size=4)
    try:
        yield opened
    finally:
        await opened.close()


async def wait_blocked(ctx: Context) -> None:
    await ctx.sleep(3600)


async def try_request(http: Any, method: str, url: str) -> int:
    return int((await http.request(method, url)).status_code)


async def attempt(ctx: Context, method: str, url: str) -> str:
    try:
        await ctx.step(try_request, ctx.http, method, url)
    except StepFailed as exc:
        return exc.error_message
    return "sent"


@pytest.mark.timeout(90)
async def test_the_guide_runs(tmp_path: Path, store: Store) -> None:
    port, unbound = free_port(), free_port()
    origin = f"127.0.0.1:{port}"
    config_text, secrets_text = blocks("toml")
    # a real API token with the scopes docs/security.md gives a retiring step
    created = await TokenService(store).create(
        "control", [Scope.EXECUTIONS_READ.value, Scope.EXECUTIONS_CANCEL.value], None)
    assert "paste-the-token-here" in secrets_text
    secrets = tmp_path / "secrets.toml"
    secrets.write_text(secrets_text.replace("paste-the-token-here", created.token))
    os.chmod(secrets, 0o600)
    config = tmp_path / "veracity.toml"
    config.write_text(config_text.replace(DOC_ORIGIN, origin)
                      .replace("/etc/veracity/secrets.toml", str(secrets)))
    settings = load_settings(config, env={})
    bindings = resolve_http(settings, {})

    guide = load_guide(tmp_path, origin)
    try:
        app = guide.app
        app.workflow("docs:target/wait.run-cancellable")(wait_blocked)
        app.workflow("docs:test/attempt.run")(attempt)
        service = ExecutionService(store, workflows=set(app.workflows), deployment_id="d-doc")
        api = create_api(service)
        seen: list[tuple[str, str, str | None]] = []

        async def recording(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                auth = dict(scope["headers"]).get(b"authorization")
                seen.append((scope["method"], scope["path"], auth.decode() if auth else None))
            await api(scope, receive, send)

        server = uvicorn.Server(uvicorn.Config(recording, host="127.0.0.1", port=port,
                                               log_config=None, lifespan="off"))
        serving = asyncio.create_task(server.serve())
        worker = Worker(store, app, settings=SETTINGS, deployment_id="d-doc", http=bindings)
        try:
            while not server.started:
                assert not serving.done(), "the API did not start"
                await asyncio.sleep(0.02)
            async with running(worker):
                target, _ = await service.submit("docs:target/wait.run-cancellable", [])
                await wait_status(store, target.id, Status.BLOCKED)
                retire, _ = await service.submit("docs:control/retire.run", [str(target.id)])
                done = await wait_status(store, retire.id, Status.COMPLETED, Status.FAILED)
                assert (done.status, done.result) == (Status.COMPLETED, "cancelled"), done.error
                assert (await service.get(target.id)).status == Status.CANCELLED
                # again: the ended execution is left alone (one GET, no cancel)
                again, _ = await service.submit("docs:control/retire.run", [str(target.id)])
                done = await wait_status(store, again.id, Status.COMPLETED, Status.FAILED)
                assert done.result == "cancelled", done.error

                # the messages the guide shows are the ones a step gets
                url = f"http://{origin}/v1/executions/x"
                refusals = []
                for method, to in [("GET", f"http://127.0.0.1:{unbound}/v1/executions"),
                                   ("DELETE", url)]:
                    e, _ = await service.submit("docs:test/attempt.run", [method, to])
                    e = await wait_status(store, e.id, Status.COMPLETED)
                    refusals.append(e.result)
        finally:
            server.should_exit = True
            await serving
    finally:
        sys.modules.pop("http_guide", None)

    path = f"/v1/executions/{target.id}"
    token = f"Bearer {created.token}"
    assert seen == [("GET", path, token), ("PUT", f"{path}/cancel", token), ("GET", path, token)]
    assert refusals == [m.replace(DOC_ORIGIN, origin).replace("127.0.0.1:9000",
                                                             f"127.0.0.1:{unbound}")
                        for m in documented_refusals()]


def test_the_guides_start_refusal_is_the_one_given(tmp_path: Path) -> None:
    config_text, _ = blocks("toml")
    config = tmp_path / "veracity.toml"
    config.write_text(config_text.replace("/etc/veracity/secrets.toml",
                                          str(tmp_path / "secrets.toml")))
    (tmp_path / "secrets.toml").write_text("other = \"0123456789\"\n")
    os.chmod(tmp_path / "secrets.toml", 0o600)
    with pytest.raises(ConfigError) as refused:
        resolve_http(load_settings(config, env={}), {})
    [shown] = re.findall(r"```\nerror: (.*?)\n```", GUIDE.read_text(), flags=re.S)
    assert str(refused.value) == shown.replace("/etc/veracity/secrets.toml",
                                               str(tmp_path / "secrets.toml"))
