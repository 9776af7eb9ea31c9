"""docs/security.md promises runnable examples: its shell line creates the token, its
Python script runs against a real server that requires tokens, its TOML is valid."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import httpx

from tests.test_server import free_port, server_env, server_process
from veracity.api import create_api
from veracity.api.auth import ROUTE_ACCESS
from veracity.clock import ManualClock
from veracity.config import load_settings
from veracity.control import ExecutionService, TokenService
from veracity.core.tokens import Scope
from veracity.examples import shop
from veracity.store import open_store

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(), flags=re.S)


def test_the_script_runs_with_the_token_the_guide_creates(tmp_path: Path) -> None:
    [shell] = blocks("sh")
    [script] = blocks("python")
    port = free_port()
    env = server_env(f"sqlite:///{tmp_path}/v.db", port, VERACITY_AUTH_REQUIRED="true")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    with server_process(tmp_path, env, port) as server:
        server.wait_healthy()
        # the guide's own shell line, as an operator would run it
        made = subprocess.run(["bash", "-ec", shell + 'printf %s "$TOKEN"'], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=60,
                              check=False)
        assert made.returncode == 0, made.stderr
        token = made.stdout
        assert re.fullmatch(r"vrc_[0-9a-f]{16}_[A-Za-z0-9_-]{43}", token), made.stdout
        with httpx.Client(base_url=server.url, timeout=5.0) as client:
            # something pending to list, submitted by an admin token
            admin = subprocess.run(
                ["veracity", "token", "create", "--name", "ops", "--scope", "admin"],
                env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
                check=True).stdout.strip()
            created = client.post(
                "/v1/executions", headers={"Authorization": f"Bearer {admin}"},
                json={"ffqn": "shop:orders/process.run", "params": ["o-1", 1],
                      "scheduled_at": "2099-01-01T00:00:00Z"})
            assert created.status_code == 201, created.text
        path = tmp_path / "script.py"
        path.write_text(script)
        ran = subprocess.run([sys.executable, str(path)],
                             env={**env, "VERACITY_URL": server.url, "VERACITY_TOKEN": token},
                             capture_output=True, text=True, timeout=60, check=False)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.splitlines() == [
            f"{created.json()['id']} shop:orders/process.run pending",
            "403 executions:submit",
        ]


def test_the_toml_example_requires_tokens(tmp_path: Path) -> None:
    [toml] = blocks("toml")
    config = tmp_path / "veracity.toml"
    config.write_text(toml)
    settings = load_settings(config, env={})
    assert settings.host == "0.0.0.0" and settings.auth.required is True
    assert settings.auth_required is True


def test_the_scope_table_names_every_route_of_each_scope() -> None:
    """The guide's table of scopes lists, under each scope, exactly the API routes that
    ``ROUTE_ACCESS`` (the one table the server enforces) gives it; ``admin``'s row names
    the routes only it grants."""

    section = GUIDE.read_text().split("## Scopes", 1)[1]
    listed: dict[str, set[tuple[str, str]]] = {}
    for scope, routes in re.findall(r"^\| `([a-z:]+)` \| (.*) \|$", section, flags=re.M):
        listed[scope] = {(method, re.sub(r"\{[^}]*\}", "{}", path)) for method, path in
                         re.findall(r"`(GET|POST|PUT|DELETE) (/v1/[^`]*)`", routes)}
    enforced: dict[str, set[tuple[str, str]]] = {}
    for (method, path), access in ROUTE_ACCESS.items():
        if path.startswith("/v1/") and isinstance(access, Scope):
            enforced.setdefault(str(access), set()).add(
                (method, re.sub(r"\{[^}]*\}", "{}", path)))
    assert listed == enforced


async def test_the_refusals_shown_are_what_the_api_answers(database_url: str) -> None:
    """The guide's two JSON refusals, word for word: a token 'nightly' made for 30 days
    on 2030-01-01 and used after, and a token 'reporting' that may only read, submitting."""
    shown = [json.loads(block) for block in blocks("json")]
    clock = ManualClock()  # 2030-01-01T00:00:00Z
    store = await open_store(database_url, clock=clock)
    try:
        tokens = TokenService(store)
        nightly = (await tokens.create("nightly", ["admin"], "30d")).token
        reporting = (await tokens.create("reporting", ["executions:read"], None)).token
        service = ExecutionService(store, workflows=set(shop.app.workflows),
                                   deployment_id="d-guide")
        api = create_api(service, auth_required=True)
        transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            clock.advance(timedelta(days=31))
            expired = await client.get("/v1/executions",
                                       headers={"Authorization": f"Bearer {nightly}"})
            refused = await client.post(
                "/v1/executions", json={"ffqn": "shop:orders/process.run", "params": ["o"]},
                headers={"Authorization": f"Bearer {reporting}"})
        assert (expired.status_code, refused.status_code) == (401, 403)
        assert [expired.json(), refused.json()] == shown
    finally:
        await store.close()
